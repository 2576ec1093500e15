"""Block-wise profiler on CPU: what it measures is checked against tensors computed here.

Times are only checked to be positive (no timing targets in unit tests); sizes are exact.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from synapse.models import ModelError, build_model, count_parameters, model_blocks
from synapse.partitioning import load_profile_csv
from synapse.profiling import (
    ComputeSetup,
    MarkTimer,
    MeasureContext,
    ProfileRequest,
    ProfilerError,
    SavedTensorBytes,
    cache_key,
    cached_profile_path,
    details_path,
    device_name,
    get_or_profile,
    load_result,
    measure,
    measurement_count,
    profile_for_config,
    profile_model,
    resolve_device,
    resolve_precision,
    save_result,
    storage_keys,
    timed_sweep,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_STUDENT_CSV = REPO_ROOT.parent / "shared" / "data" / "synapse_profiles" / "snet_resnet152.csv"
TINY = dict(num_classes=10, in_chans=1, image_size=32)
MICRO_BATCH = 2
KB = 1024
CASES = [("resnet_micro", "student"), ("vit_micro", "student"), ("efficientnet_micro", "student"),
         ("vit_micro", "teacher"), ("resnet_micro", "teacher")]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Two cores shared with other work: more threads only add noise and minutes.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def profiles():
    return {(model, role): profile_model(model, role, MICRO_BATCH, warmup=1, repeats=2, **TINY)
            for model, role in CASES}


def fast_request(model: str = "vit_micro", role: str = "teacher", **overrides) -> ProfileRequest:
    values = dict(micro_batch=1, warmup=0, repeats=1, **TINY)
    values.update(overrides)
    return ProfileRequest(model, role, **values)


def reference_blocks(model_name: str, autocast: bool = False):
    """Boundary tensor bytes and parameter bytes of each block, computed by running the blocks here."""
    model = build_model(model_name, TINY["num_classes"], TINY["in_chans"], TINY["image_size"])
    blocks = model_blocks(model)
    x = torch.zeros(MICRO_BATCH, TINY["in_chans"], TINY["image_size"], TINY["image_size"])
    boundaries = [x.numel() * x.element_size()]
    precision = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.no_grad(), precision:
        for block in blocks:
            x = block(x)
            boundaries.append(x.numel() * x.element_size())
    parameters = [sum(p.numel() * p.element_size() for p in block.parameters()) for block in blocks]
    return model, blocks, boundaries, parameters


# ---------------------------------------------------------------- what is measured


@pytest.mark.parametrize("model_name, role", CASES)
def test_one_row_per_block_named_in_order(profiles, model_name, role):
    profile = profiles[model_name, role].profile
    _, blocks, _, _ = reference_blocks(model_name)
    assert len(profile) == len(blocks)
    assert [b.layer for b in profile.blocks] == [f"layer{i}" for i in range(len(blocks))]
    assert profiles[model_name, role].details.num_blocks == len(blocks)


@pytest.mark.parametrize("model_name, role", CASES)
def test_times_are_positive_and_teachers_have_no_backward(profiles, model_name, role):
    profile = profiles[model_name, role].profile
    assert (profile.column("forward_time_ms") > 0).all()
    backward = profile.column("backward_time_ms")
    if role == "teacher":
        assert (backward == 0).all()
    else:
        assert (backward >= 0).all()
        assert (backward[profile.column("parameter_size_kb") > 0] > 0).all()


@pytest.mark.parametrize("model_name", ["resnet_micro", "efficientnet_micro"])
def test_an_identity_block_costs_no_backward(profiles, model_name):
    # Dropout with p=0 hands its input on unchanged: its two boundaries are one point in backward.
    _, blocks, _, _ = reference_blocks(model_name)
    dropout = next(i for i, b in enumerate(blocks) if type(b).__name__ == "FunctionalDropout")
    assert profiles[model_name, "student"].profile.blocks[dropout].backward_time_ms == 0.0


@pytest.mark.parametrize("model_name, role", CASES)
def test_parameter_sizes_are_the_blocks_parameter_bytes(profiles, model_name, role):
    profile = profiles[model_name, role].profile
    model, _, _, parameters = reference_blocks(model_name)
    assert list(profile.column("parameter_size_kb")) == [p / KB for p in parameters]
    # Blocks cover every parameter exactly once (fp32 weights, 4 bytes each).
    assert profile.column("parameter_size_kb").sum() * KB == count_parameters(model) * 4


@pytest.mark.parametrize("model_name, role", CASES)
def test_activation_sizes_are_the_boundary_tensor_bytes(profiles, model_name, role):
    profile = profiles[model_name, role].profile
    _, _, boundaries, _ = reference_blocks(model_name)
    assert list(profile.column("input_activation_size_kb")) == [b / KB for b in boundaries[:-1]]
    assert list(profile.column("output_activation_size_kb")) == [b / KB for b in boundaries[1:]]


@pytest.mark.parametrize("model_name, role", CASES)
def test_metadata_and_details_describe_the_measurement(profiles, model_name, role):
    result = profiles[model_name, role]
    assert result.profile.model_name == model_name
    assert result.profile.micro_batch == MICRO_BATCH
    assert result.profile.dtype == "fp32"
    assert result.profile.device == device_name(torch.device("cpu"))
    details = result.details
    assert (details.role, details.device, details.torch_version) == (role, "cpu", torch.__version__)
    assert (details.warmup, details.repeats, details.channels_last) == (1, 2, False)
    assert details.blocks_forward_ms == pytest.approx(result.profile.column("forward_time_ms").sum())
    assert details.whole_forward_ms > 0 and math.isfinite(details.forward_ratio) and details.forward_ratio > 0
    if role == "teacher":
        assert details.backward_ratio is None and details.whole_backward_ms == 0
    else:
        assert details.whole_backward_ms > 0 and details.backward_ratio > 0


@pytest.mark.parametrize("model_name", ["resnet_micro", "vit_micro", "efficientnet_micro"])
def test_student_blocks_with_weighted_layers_keep_activations_for_backward(profiles, model_name):
    profile = profiles[model_name, "student"].profile
    _, blocks, _, _ = reference_blocks(model_name)
    weighted = (torch.nn.Conv2d, torch.nn.Linear, torch.nn.LayerNorm, torch.nn.BatchNorm2d)
    for block, row in zip(blocks, profile.blocks):
        if any(isinstance(module, weighted) for module in block.modules()):
            assert row.accum_activation_size_kb > 0, row


def test_parameters_that_are_only_added_save_nothing(profiles):
    # ViT's token embedding concatenates the class token and adds the position embedding:
    # parameters, but nothing that backward needs to keep.
    token_embed = profiles["vit_micro", "student"].profile.blocks[1]
    assert token_embed.parameter_size_kb > 0 and token_embed.accum_activation_size_kb == 0


def test_student_accum_counts_exactly_what_autograd_saves(profiles):
    profile = profiles["resnet_micro", "student"].profile
    relu, maxpool, head = profile.blocks[2], profile.blocks[3], profile.blocks[-1]
    # ReLU saves its result; max-pool its input and int64 indices (one per output element, fp32 output).
    assert relu.accum_activation_size_kb == relu.output_activation_size_kb
    assert maxpool.accum_activation_size_kb == maxpool.input_activation_size_kb + 2 * maxpool.output_activation_size_kb
    # A Linear saves its input; its weight is a parameter and is not counted again.
    assert head.accum_activation_size_kb == head.input_activation_size_kb


@pytest.mark.parametrize("model_name", ["vit_micro", "resnet_micro"])
def test_teacher_accum_on_cpu_is_the_output_size(profiles, model_name):
    profile = profiles[model_name, "teacher"].profile
    assert list(profile.column("accum_activation_size_kb")) == list(profile.column("output_activation_size_kb"))
    assert profiles[model_name, "teacher"].details.accum_method == "output_size"


def test_bf16_boundaries_follow_autocast_and_weight_copies_count():
    result = profile_model("vit_micro", "student", MICRO_BATCH, dtype="bf16", warmup=0, repeats=1, **TINY)
    model, _, boundaries, _ = reference_blocks("vit_micro", autocast=True)
    profile = result.profile
    assert profile.dtype == "bf16"
    assert list(profile.column("output_activation_size_kb")) == [b / KB for b in boundaries[1:]]
    assert boundaries != reference_blocks("vit_micro")[2]  # autocast really changed some boundary
    # The head (Linear) saves its input cast to bf16 and autocast's bf16 copy of its weight.
    head = profile.blocks[-1]
    weight_copy = model.head.weight.numel() * 2
    assert head.accum_activation_size_kb * KB == head.input_activation_size_kb * KB / 2 + weight_copy


def test_profiling_leaves_the_global_rng_as_it_was():
    state = torch.get_rng_state()
    profile_model("vit_micro", "teacher", 1, warmup=0, repeats=1, **TINY)
    assert torch.equal(torch.get_rng_state(), state)


# ---------------------------------------------------------------- files and cache


def test_csv_round_trips_through_the_planner_loader(profiles, tmp_path):
    result = profiles["resnet_micro", "student"]
    path = save_result(result, tmp_path / "sub" / "student.csv")
    assert load_profile_csv(path) == result.profile
    assert load_result(path) == result
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "student.csv", "student.csv.details.json", "student.csv.meta.json"]


def test_cache_hit_returns_the_stored_profile_without_measuring(tmp_path):
    request = fast_request()
    first, path = get_or_profile(request, tmp_path)
    assert path == cached_profile_path(request, tmp_path) and path.parent == tmp_path / "profiles"
    count, mtime = measurement_count(), path.stat().st_mtime_ns
    again, again_path = get_or_profile(request, tmp_path)
    assert (again, again_path) == (first, path)
    assert measurement_count() == count and path.stat().st_mtime_ns == mtime
    get_or_profile(request, tmp_path, refresh=True)
    assert measurement_count() == count + 1


def test_another_micro_batch_is_another_cache_entry(tmp_path):
    _, one = get_or_profile(fast_request(micro_batch=1), tmp_path)
    count = measurement_count()
    result, two = get_or_profile(fast_request(micro_batch=3), tmp_path)
    assert one != two and measurement_count() == count + 1
    assert result.profile.micro_batch == 3


def test_profile_for_config_writes_teacher_and_student_csvs(tmp_path):
    kwargs = dict(teacher_name="vit_micro", student_name="resnet_micro", micro_batch=2, precision="auto",
                  device="cpu", cache_dir=tmp_path, warmup=0, repeats=1, **TINY)
    paths = profile_for_config(**kwargs)
    teacher, student = load_profile_csv(paths.teacher), load_profile_csv(paths.student)
    assert (teacher.model_name, student.model_name) == ("vit_micro", "resnet_micro")
    assert (teacher.dtype, student.dtype) == ("fp32", "fp32")  # auto on CPU
    assert (teacher.column("backward_time_ms") == 0).all() and student.column("backward_time_ms").sum() > 0
    count = measurement_count()
    assert profile_for_config(**kwargs) == paths and measurement_count() == count


def test_a_plain_csv_loads_without_details(tmp_path):
    if not SHARED_STUDENT_CSV.exists():
        pytest.skip("shared profiles not present")
    result = load_result(SHARED_STUDENT_CSV)
    assert result.details is None and len(result.profile) == 57


@pytest.mark.parametrize("content, message", [("{not json", "not valid JSON"), ('{"role": "student"}', "missing")])
def test_broken_details_file_says_how_to_recover(profiles, tmp_path, content, message):
    path = save_result(profiles["vit_micro", "teacher"], tmp_path / "t.csv")
    details_path(path).write_text(content)
    with pytest.raises(ProfilerError, match=message) as error:
        load_result(path)
    assert "re-profile" in str(error.value)


def test_details_written_before_graphed_profiles_load_as_eager(profiles, tmp_path):
    path = save_result(profiles["vit_micro", "teacher"], tmp_path / "t.csv")
    data = json.loads(details_path(path).read_text())
    assert data.pop("launch") == "eager"
    details_path(path).write_text(json.dumps(data))
    assert load_result(path).details.launch == "eager"


def test_graphed_profiles_are_cached_apart_from_eager_ones():
    eager = cache_key(fast_request(), "NVIDIA H200")
    graphed = cache_key(fast_request(device="cuda:0", launch="graphed"), "NVIDIA H200")
    assert graphed == eager + "_graphed2"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_profile_blocks_add_up_to_the_whole_replayed_model():
    """Blocks timed inside one captured whole-model pass, then scaled so they sum to the whole model
    replayed as one graph (inside one graph they already nearly do); below the eager sweep's time
    at a launch-bound micro-batch. ResNet-18's parameter-free blocks (ReLU, max-pool) included."""
    kwargs = dict(micro_batch=8, dtype="bf16", device="cuda:0", num_classes=10, image_size=64, warmup=2, repeats=5)
    for model, role in (("resnet18", "student"), ("vit_tiny", "teacher")):
        graphed = profile_model(model, role, launch="graphed", **kwargs)
        eager = profile_model(model, role, **kwargs)
        details = graphed.details
        assert details.launch == "graphed"
        assert details.block_timing == "in_graph"
        assert 0.8 < details.forward_ratio < 1.25  # block replays one by one summed to 1.25x and more
        assert details.block_scale_forward == pytest.approx(1 / details.forward_ratio)
        forward = sum(b.forward_time_ms for b in graphed.profile.blocks)
        backward = sum(b.backward_time_ms for b in graphed.profile.blocks)
        assert forward == pytest.approx(details.whole_forward_ms, rel=1e-4)
        if role == "student":
            assert backward == pytest.approx(details.whole_backward_ms, rel=1e-4)
        total = lambda r: sum(b.forward_time_ms + b.backward_time_ms for b in r.profile.blocks)  # noqa: E731
        assert total(graphed) < total(eager)


# ---------------------------------------------------------------- requests and errors


@pytest.mark.parametrize("overrides, message", [
    (dict(device="tpu"), "'tpu' is not a device"),
    (dict(device="cuda:x"), "'cuda:x' is not a device"),
    (dict(device="cpu:0"), "'cpu:0' is not a device"),
    (dict(dtype="fp16"), "dtype='fp16' is unknown"),
    (dict(launch="compiled"), "launch='compiled' is unknown"),
    (dict(launch="graphed"), "launch='graphed' needs a CUDA device"),
    (dict(role="both"), "role='both' is unknown"),
    (dict(micro_batch=0), "micro_batch=0"),
    (dict(repeats=0), "repeats=0"),
    (dict(warmup=-1), "warmup=-1"),
    (dict(image_size=True), "image_size=True"),
])
def test_bad_requests_are_refused_with_the_value_and_a_fix(overrides, message):
    with pytest.raises(ProfilerError, match=message):
        fast_request(**overrides)


def test_a_block_that_cannot_run_names_itself_and_the_micro_batch():
    # resnet_micro at 32 px ends in 1x1 feature maps: training BatchNorm needs two values per channel.
    with pytest.raises(ProfilerError, match=r"resnet_micro \(student\) block \d+ .* micro_batch=1") as error:
        profile_model("resnet_micro", "student", 1, warmup=0, repeats=1, **TINY)
    assert "Expected more than 1 value per channel" in str(error.value)


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(ModelError, match="resnet_micro"):
        fast_request(model="resnet9000")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_a_gpu_says_to_use_cpu():
    request = fast_request(device="cuda:0")  # well-formed: accepted until it is resolved
    with pytest.raises(ProfilerError, match="use device='cpu'|profile with device='cpu'"):
        profile_model("vit_micro", "teacher", 1, device="cuda", warmup=0, repeats=1, **TINY)
    with pytest.raises(ProfilerError, match="no CUDA device"):
        resolve_device(request.device)


def test_resolve_precision_follows_the_trainer():
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("auto", "cuda:1") == "bf16"
    assert resolve_precision("bf16", "cpu") == "bf16"
    with pytest.raises(ProfilerError, match="precision='fp8'"):
        resolve_precision("fp8", "cpu")


def test_cache_key_changes_with_everything_measured_and_nothing_else():
    base = fast_request()
    key = cache_key(base, "NVIDIA H200")
    changed = [fast_request(model="resnet_micro"), fast_request(role="student"), fast_request(micro_batch=2),
               fast_request(dtype="bf16"), fast_request(image_size=64), fast_request(num_classes=11),
               fast_request(in_chans=3)]
    keys = {cache_key(request, "NVIDIA H200") for request in changed}
    assert len(keys) == len(changed) and key not in keys
    assert cache_key(base, "NVIDIA H100 80GB HBM3") != key
    assert cache_key(fast_request(warmup=5, repeats=50), "NVIDIA H200") == key
    assert key == "vit_micro_teacher_mb1_fp32_nvidia-h200_32px_1ch_10cls"


# ---------------------------------------------------------------- measurement primitives


def test_mark_timer_reports_gaps_between_marks_in_ms(monkeypatch):
    ticks = iter([10.0, 10.5, 10.75])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(ticks))
    timer = MarkTimer(torch.device("cpu"))
    for key in ("start", ("block", 0), "end"):
        timer.mark(key)
    assert timer.elapsed_ms("start", ("block", 0)) == 500.0
    assert timer.elapsed_ms("start", "end") == 750.0
    assert timer.has("end") and not timer.has(("block", 1))


def test_backward_marks_follow_the_gradient_of_every_boundary(monkeypatch):
    # A fake clock that moves only inside blocks: 1 ms per forward, 10 ms per backward of each
    # block. Every block then measures exactly its own share, an in-place block included.
    clock = {"now": 0.0}

    class Tick(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            clock["now"] += 1e-3
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            clock["now"] += 1e-2
            return grad

    class Block(torch.nn.Module):
        def __init__(self, inplace: bool = False):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(()))
            self.inplace = inplace

        def forward(self, x):
            y = Tick.apply(x * self.scale)
            return y.add_(0.0) if self.inplace else y  # in place, but saves nothing

    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock["now"])
    blocks = [Block(), Block(inplace=True), torch.nn.ReLU(inplace=True), Block()]
    model = torch.nn.Sequential(*blocks)
    context = MeasureContext(fast_request(role="student"), ComputeSetup(torch.device("cpu"), None, False))
    times = timed_sweep(model, blocks, torch.ones(4), context)
    assert times.forward_ms == pytest.approx([1.0, 1.0, 0.0, 1.0])
    assert times.backward_ms == pytest.approx([10.0, 10.0, 0.0, 10.0])
    assert (times.whole_forward_ms, times.whole_backward_ms) == pytest.approx((3.0, 30.0))


def test_saved_tensor_bytes_count_each_storage_once_and_skip_excluded():
    x = torch.randn(100, requires_grad=True)  # 400 bytes
    with SavedTensorBytes(exclude=set()) as saved:
        y = x * x  # saves x twice
    assert saved.total == 400 and y.requires_grad
    matrix = torch.randn(10, 10, requires_grad=True)
    with SavedTensorBytes(exclude=set()) as saved:
        matrix[:5].sin()  # a view keeps its whole storage alive
    assert saved.total == 400
    with SavedTensorBytes(exclude=storage_keys([matrix])) as saved:
        (matrix[:5] * 2).sin()  # the product is new memory; the matrix itself is excluded
    assert saved.total == 200
    with SavedTensorBytes(exclude=set()) as saved, torch.no_grad():
        x.exp()
    assert saved.total == 0


# ---------------------------------------------------------------- the experiment script


def test_profile_models_script_writes_profiles_and_an_index(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("profile_models", REPO_ROOT / "experiments" / "profile_models.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = ["--teachers", "vit_micro", "--students", "resnet_micro", "--micro-batches", "2", "3",
            "--image-size", "32", "--in-chans", "1", "--num-classes", "10", "--warmup", "0", "--repeats", "1",
            "--out", str(tmp_path)]
    assert script.main(argv) == 0
    index = json.loads((tmp_path / "index.json").read_text())
    entries = index["profiles"]
    assert [(e["model"], e["role"], e["micro_batch"]) for e in entries] == [
        ("vit_micro", "teacher", 2), ("vit_micro", "teacher", 3), ("resnet_micro", "student", 2),
        ("resnet_micro", "student", 3)]
    for entry in entries:
        assert load_profile_csv(tmp_path / entry["csv"]).micro_batch == entry["micro_batch"]
        assert not entry["cached"]
    assert "[4/4] resnet_micro student mb3" in capsys.readouterr().out
    script.main(argv)
    assert all(e["cached"] for e in json.loads((tmp_path / "index.json").read_text())["profiles"])
