"""Block-profile CSV format: loading the shared TSPipe profiles, validation, round trip, scaling."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from synapse.partitioning import (
    PROFILE_COLUMNS,
    SHARED_PROFILE_MICRO_BATCH,
    BlockProfile,
    ModelProfile,
    ProfileError,
    load_profile_csv,
    metadata_path,
    scale_to_micro_batch,
    write_profile_csv,
)

SHARED = Path(__file__).resolve().parents[1] / "data" / "synapse_profiles"
TEACHER_CSV = SHARED / "tnet_vit_large.csv"
STUDENT_CSV = SHARED / "snet_resnet152.csv"
HEADER = ",".join(PROFILE_COLUMNS)


def write_text(tmp_path: Path, text: str, name: str = "model.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def block(layer: str = "layer0", **overrides: float) -> BlockProfile:
    values = dict(forward_time_ms=1.5, backward_time_ms=3.0, input_activation_size_kb=10.0,
                  output_activation_size_kb=20.0, accum_activation_size_kb=30.0, parameter_size_kb=4.0)
    values.update(overrides)
    return BlockProfile(layer=layer, **values)


def test_shared_teacher_profile_loads_as_is():
    teacher = load_profile_csv(TEACHER_CSV)
    assert teacher.name == "tnet_vit_large"
    assert len(teacher) == 30
    assert [b.layer for b in teacher.blocks[:2]] == ["layer0", "layer1"]
    assert all(b.backward_time_ms == 0.0 for b in teacher.blocks)  # forward-only teacher
    # micro-batch 64, fp32, 3x224x224 images: the input activation in KiB
    assert teacher.blocks[0].input_activation_size_kb == 64 * 3 * 224 * 224 * 4 / 1024
    assert teacher.micro_batch is None and teacher.device is None  # no sidecar for shared files


def test_shared_student_profile_loads_as_is():
    student = load_profile_csv(STUDENT_CSV)
    assert len(student) == 57
    assert all(b.backward_time_ms > 0 for b in student.blocks)
    assert student.blocks[-1].output_activation_size_kb == 25.0  # 64 x 100 logits x 4 B


@pytest.mark.parametrize("source", [TEACHER_CSV, STUDENT_CSV])
def test_writing_a_shared_profile_reproduces_the_file_byte_for_byte(tmp_path, source):
    written = write_profile_csv(load_profile_csv(source), tmp_path / source.name)
    assert written.read_bytes() == source.read_bytes()


def test_round_trip_keeps_blocks_and_metadata(tmp_path):
    profile = ModelProfile(
        name="tiny", blocks=(block("a", forward_time_ms=0.1 + 0.2), block("b", parameter_size_kb=0.0)),
        model_name="resnet18", micro_batch=32, dtype="bfloat16", device="NVIDIA H200",
    )
    path = write_profile_csv(profile, tmp_path / "tiny_profile.csv")
    assert path.read_text().splitlines()[0] == HEADER
    assert json.loads(metadata_path(path).read_text())["micro_batch"] == 32
    assert load_profile_csv(path) == profile


def test_sidecar_is_rewritten_so_a_stale_one_cannot_describe_a_new_csv(tmp_path):
    path = tmp_path / "m.csv"
    write_profile_csv(ModelProfile("m", (block(),), micro_batch=8), path)
    write_profile_csv(ModelProfile("m", (block(),)), path)
    assert load_profile_csv(path).micro_batch is None


def test_blank_trailing_lines_are_ignored(tmp_path):
    path = write_text(tmp_path, f"{HEADER}\nlayer0,1,2,3,4,5,6\n\n\n")
    assert len(load_profile_csv(path)) == 1


def test_columns_in_another_order_are_read_by_name(tmp_path):
    reordered = list(reversed(PROFILE_COLUMNS))
    path = write_text(tmp_path, ",".join(reordered) + "\n6,5,4,3,2,1,layer0\n")
    only = load_profile_csv(path).blocks[0]
    assert only.forward_time_ms == 1.0 and only.parameter_size_kb == 6.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "file is empty"),
        (f"{HEADER}\n", "no block rows"),
        ("layer,forward_time_ms\nlayer0,1\n", "missing columns"),
        (f"{HEADER},flops\nlayer0,1,2,3,4,5,6,7\n", "unexpected columns ['flops']"),
        (f"{HEADER},layer\nlayer0,1,2,3,4,5,6,x\n", "duplicated columns ['layer']"),
        (f"{HEADER}\nlayer0,1,2,3,4,5\n", "line 2 has 6 fields"),
        (f"{HEADER}\nlayer0,1,2,3,4,5,6,7\n", "line 2 has 8 fields"),
        (f"{HEADER}\nlayer0,fast,2,3,4,5,6\n", "'forward_time_ms': 'fast' is not a number"),
        (f"{HEADER}\nlayer0,1,,3,4,5,6\n", "'backward_time_ms': value is missing"),
        (f"{HEADER}\nlayer0,1,2,nan,4,5,6\n", "'input_activation_size_kb': value nan is not finite"),
        (f"{HEADER}\nlayer0,1,2,3,inf,5,6\n", "'output_activation_size_kb': value inf is not finite"),
        (f"{HEADER}\nlayer0,1,2,3,4,-5,6\n", "'accum_activation_size_kb': value -5.0 is negative"),
        (f"{HEADER}\n,1,2,3,4,5,6\n", "column 'layer' is empty"),
        (f"{HEADER}\nlayer0,1,2,3,4,5,6\nlayer0,1,2,3,4,5,6\n", "'layer0' appears twice"),
    ],
)
def test_malformed_files_raise_profile_error_naming_the_problem(tmp_path, text, expected):
    path = write_text(tmp_path, text)
    with pytest.raises(ProfileError) as error:
        load_profile_csv(path)
    assert expected in str(error.value)
    assert str(path) in str(error.value)


def test_cell_errors_name_the_layer(tmp_path):
    path = write_text(tmp_path, f"{HEADER}\nlayer0,1,2,3,4,5,6\nblock7,1,2,3,4,5,x\n")
    with pytest.raises(ProfileError, match="layer 'block7', column 'parameter_size_kb'"):
        load_profile_csv(path)


def test_profile_error_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="no such profile file"):
        load_profile_csv(tmp_path / "missing.csv")


@pytest.mark.parametrize(
    ("sidecar", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"batch": 4}', "unknown keys ['batch']"),
        ('{"micro_batch": "64"}', "micro_batch='64' must be int"),
        ('{"micro_batch": 0}', "micro_batch=0 must be a positive integer"),
        ('{"dtype": 32}', "dtype=32 must be str"),
    ],
)
def test_bad_sidecar_raises(tmp_path, sidecar, expected):
    path = write_text(tmp_path, f"{HEADER}\nlayer0,1,2,3,4,5,6\n")
    metadata_path(path).write_text(sidecar)
    with pytest.raises(ProfileError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        load_profile_csv(path)


def test_block_and_model_validation_without_files():
    with pytest.raises(ProfileError, match="negative"):
        block(forward_time_ms=-1.0)
    with pytest.raises(ProfileError, match="no blocks"):
        ModelProfile("empty", ())
    with pytest.raises(ProfileError, match="unknown column 'flops'"):
        ModelProfile("m", (block(),)).column("flops")


def test_column_returns_values_in_block_order():
    profile = ModelProfile("m", (block("a", forward_time_ms=1.0), block("b", forward_time_ms=2.5)))
    assert profile.column("forward_time_ms").tolist() == [1.0, 2.5]


def test_scaling_is_linear_in_batch_for_times_and_activations_only():
    profile = ModelProfile("m", (block(),), micro_batch=64)
    half = scale_to_micro_batch(profile, 32)
    scaled, original = half.blocks[0], profile.blocks[0]
    assert half.micro_batch == 32
    assert scaled.forward_time_ms == original.forward_time_ms / 2
    assert scaled.backward_time_ms == original.backward_time_ms / 2
    for column in ("input_activation_size_kb", "output_activation_size_kb", "accum_activation_size_kb"):
        assert getattr(scaled, column) == getattr(original, column) / 2
    assert scaled.parameter_size_kb == original.parameter_size_kb


def test_scaling_a_shared_profile_needs_its_batch_size():
    teacher = load_profile_csv(TEACHER_CSV)
    with pytest.raises(ProfileError, match=f"measured at {SHARED_PROFILE_MICRO_BATCH}"):
        scale_to_micro_batch(teacher, 16)
    small = scale_to_micro_batch(teacher, 16, from_micro_batch=SHARED_PROFILE_MICRO_BATCH)
    assert small.blocks[0].input_activation_size_kb == 16 * 3 * 224 * 224 * 4 / 1024


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_scaling_rejects_bad_batch_sizes(bad):
    with pytest.raises(ProfileError, match="positive integer"):
        scale_to_micro_batch(ModelProfile("m", (block(),), micro_batch=8), bad)


def test_scaling_keeps_other_metadata():
    profile = ModelProfile("m", (block(),), model_name="vit", micro_batch=8, dtype="float32", device="cpu")
    assert dataclasses.replace(scale_to_micro_batch(profile, 16), blocks=profile.blocks, micro_batch=8) == profile
