"""data.decode=auto and data.num_workers=auto: the data path chosen from the host's cores, ranks and
decoders (synapse.data.host_path; what a rank's config becomes: test_data_path.py)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synapse.data import choose_host_data_path
from synapse.data.host_path import CORES_PER_RANK, CPU_DECODE_MIN_WORKERS, MAX_WORKERS


def choose(cores, ranks=1, readers=1, on_cuda=True, decoder=True, decode="auto", workers="auto", files=True):
    return choose_host_data_path(decode=decode, workers=workers, reads_files=files, cores=cores, local_ranks=ranks,
                                 local_readers=readers, on_cuda=on_cuda, device_decoder=decoder)


@pytest.mark.parametrize("case,host,expected", [
    # the H200 host measured (16 cores, one GPU): the setting that ran at 0.95-0.97 of resident data
    ("one GPU, 16 cores", dict(cores=16), ("cpu", 14)),
    ("4 data-parallel GPUs, 64 cores", dict(cores=64, ranks=4, readers=4), ("cpu", 14)),
    ("4 data-parallel GPUs, 32 cores", dict(cores=32, ranks=4, readers=4), ("gpu", 6)),
    ("the same without nvJPEG", dict(cores=32, ranks=4, readers=4, decoder=False), ("cpu", 6)),
    # a pipeline of 3 on 16 cores: one rank reads images, the other two keep their cores
    ("3-stage pipeline, 16 cores", dict(cores=16, ranks=3, readers=1), ("cpu", 10)),
    ("2x2 layout, 16 cores", dict(cores=16, ranks=4, readers=2), ("gpu", 4)),
    ("a 2-core CPU machine", dict(cores=2, on_cuda=False), ("cpu", 0)),
    ("more cores than workers pay for", dict(cores=128), ("cpu", MAX_WORKERS)),
])
def test_the_host_decides_where_jpegs_are_decoded_and_by_how_many_workers(case, host, expected):
    path = choose(**host)
    assert (path.decode, path.workers) == expected, case
    assert str(path.workers) in path.reason


def test_settings_that_are_not_auto_are_kept():
    assert (choose(16, workers=4, decode="gpu").decode, choose(16, workers=4, decode="gpu").workers) == ("gpu", 4)
    assert choose(16, decode="gpu").decode == "gpu"  # decode as asked, workers from the host
    assert choose(16, decode="gpu").workers == 14
    assert choose(4, workers=12).decode == "cpu"  # 12 configured workers keep up: they decode
    assert choose(64, workers=2).decode == "gpu"  # 2 do not: nvJPEG does


def test_a_data_set_that_decodes_no_files_gets_no_workers():
    assert choose(64, files=False).workers == 0
    assert choose(64, files=False, workers=3).workers == 3


@given(cores=st.integers(1, 256), ranks=st.integers(1, 16), readers=st.integers(1, 16), on_cuda=st.booleans(),
       decoder=st.booleans())
def test_auto_workers_never_take_the_ranks_own_cores(cores, ranks, readers, on_cuda, decoder):
    readers = min(readers, ranks)
    path = choose(cores, ranks, readers, on_cuda, decoder)
    assert 0 <= path.workers <= MAX_WORKERS
    assert path.workers * readers + CORES_PER_RANK * ranks <= max(cores, CORES_PER_RANK * ranks)
    if path.decode == "gpu":
        assert on_cuda and decoder and path.workers < CPU_DECODE_MIN_WORKERS
