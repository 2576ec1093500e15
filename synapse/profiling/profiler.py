"""Measure a model block by block: the numbers the planner's cost model is made of.

Per block (``synapse.models.model_blocks``) a profile holds forward time, backward time
(student only), the bytes of the tensors at its input and output boundaries, the memory it
keeps for backward, and its parameter bytes (one CSV row, see ``synapse.partitioning.profile``).
The details next to it hold the whole model's times, measured alongside, as a sanity check.

How: one untimed sweep measures sizes (``sweeps.size_sweep``), ``warmup`` untimed sweeps let
cudnn choose its algorithms, then ``repeats`` timed sweeps each run the blocks as one stream,
marking the time at every block boundary, and then the whole model (``sweeps.timed_sweep``);
every time is the median over the timed sweeps. CUDA marks are events with one
synchronisation per sweep, so times are what the GPU spends, including waits for the host
where the host cannot keep up (small micro-batches).
The student trains (train mode, forward then backward, gradients accumulating across sweeps
as across micro-batches); the teacher runs forward only, in eval mode under no_grad.
Precision and layout follow the trainer: bf16 under autocast, channels_last for conv nets on
CUDA, cudnn.benchmark on.
"""
from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import timm
import torch
from torch import nn

from synapse.models import build_model, model_blocks, model_spec
from synapse.partitioning import BYTES_PER_KB, BlockProfile, ModelProfile
from synapse.profiling.context import ComputeSetup, MeasureContext
from synapse.profiling.graphed import graphed_times
from synapse.profiling.request import ProfileRequest, cache_key, device_name, resolve_device
from synapse.profiling.result import ProfileDetails, ProfileResult
from synapse.profiling.sweeps import BlockSizes, SweepTimes, size_sweep, timed_sweep

Log = Callable[[str], None]
logger = logging.getLogger(__name__)
_measurements = 0  # how many profiles this process has measured (lets tests see a cache hit)


def measurement_count() -> int:
    return _measurements


@dataclass(frozen=True)
class _Medians:
    """Per-block and whole-model medians over the timed sweeps."""

    forward_ms: list[float]
    backward_ms: list[float]
    whole_forward_ms: float
    whole_backward_ms: float
    launch: str  # how the blocks were timed: 'eager' sweeps or 'graphed' replays
    forward_scale: float = 1.0  # what the block times were multiplied by (graphed: to sum to the whole)
    backward_scale: float = 1.0
    block_timing: str = "sweeps"  # graphed: 'in_graph' (one whole-model graph) or 'block_replays'

    @classmethod
    def of(cls, sweeps: list[SweepTimes], launch: str) -> _Medians:
        def per_block(samples: list[list[float]]) -> list[float]:
            return [float(statistics.median(column)) for column in zip(*samples)]

        return cls(per_block([s.forward_ms for s in sweeps]), per_block([s.backward_ms for s in sweeps]),
                   float(statistics.median(s.whole_forward_ms for s in sweeps)),
                   float(statistics.median(s.whole_backward_ms for s in sweeps)), launch)


def profile_model(model_name: str, role: str, micro_batch: int, dtype: str = "fp32", device: str = "cpu",
                  num_classes: int = 1000, in_chans: int = 3, image_size: int = 224, warmup: int = 3,
                  repeats: int = 10, log: Log | None = None, launch: str = "eager") -> ProfileResult:
    """Measure ``model_name`` in ``role`` ('teacher' | 'student'); see ``run_profile``."""
    request = ProfileRequest(model_name, role, micro_batch, dtype, device, num_classes, in_chans, image_size,
                             warmup, repeats, launch)
    return run_profile(request, log)


def run_profile(request: ProfileRequest, log: Log | None = None) -> ProfileResult:
    """Build the model on the device, measure its blocks and the whole model."""
    global _measurements
    device = resolve_device(request.device)
    started = time.perf_counter()
    with _on_device(device):
        context = MeasureContext(request, _compute_setup(request, device))
        sizes, medians = _measure(context)
    _measurements += 1
    hardware = device_name(device)
    rows = tuple(_row(index, size, medians) for index, size in enumerate(sizes))
    profile = ModelProfile(name=cache_key(request, hardware), blocks=rows, model_name=request.model_name,
                           micro_batch=request.micro_batch, dtype=request.dtype, device=hardware)
    details = _details(context, hardware, medians, time.perf_counter() - started)
    if log:
        log(f"{request.model_name} ({request.role}): {len(rows)} blocks, forward blocks/whole "
            f"{details.forward_ratio:.3f}" + (f", backward {details.backward_ratio:.3f}"
                                               if details.backward_ratio is not None else "")
            + f" ({details.elapsed_s:.1f} s)")
    return ProfileResult(profile, details)


def _measure(context: MeasureContext) -> tuple[list[BlockSizes], _Medians]:
    request = context.request
    model = _build_model(context)
    blocks = model_blocks(model)
    images = _random_images(context)
    sizes = size_sweep(model, blocks, images, context)
    medians = _graphed_medians(blocks, images, context) if request.launch == "graphed" else None
    if medians is None:
        sweeps = [timed_sweep(model, blocks, images, context) for _ in range(request.warmup + request.repeats)]
        medians = _Medians.of(sweeps[request.warmup:], launch="eager")
    model.zero_grad(set_to_none=True)
    del model, blocks, images
    if context.device.type == "cuda":
        torch.cuda.synchronize(context.device)
        torch.cuda.empty_cache()  # hand the memory back before the next model is built
    return sizes, medians


def _graphed_medians(blocks, images: torch.Tensor, context: MeasureContext) -> _Medians | None:
    """Block times as replayed graphs, or None (logged) where this model cannot be captured:
    the stages then run it eagerly too, and the eager sweeps measure what they will see."""
    try:
        times = graphed_times(blocks, images, context)
    except Exception as exc:  # noqa: BLE001 - any capture failure falls back to the eager measurement
        logger.warning("%s (%s): cannot be captured as CUDA graphs (%s: %s); profiled eagerly",
                       context.request.model_name, context.request.role, type(exc).__name__, exc)
        return None
    # The whole model's replay is the truth for the total; the blocks say how it splits. Timed
    # inside one graph they sum to it but for the event nodes; replayed one by one, each carries a
    # launch, which a stage's one graph does not pay between its blocks (ResNet-50 at micro-batch
    # 32 on an H200: block replays summed to 1.25x the whole forward, 1.42x the backward).
    forward_scale = _scale(times.whole_forward_ms, times.forward_ms)
    backward_scale = _scale(times.whole_backward_ms, times.backward_ms)
    return _Medians([t * forward_scale for t in times.forward_ms], [t * backward_scale for t in times.backward_ms],
                    times.whole_forward_ms, times.whole_backward_ms, "graphed", forward_scale, backward_scale,
                    times.method)


def _scale(whole_ms: float, blocks_ms: list[float]) -> float:
    total = sum(blocks_ms)
    return whole_ms / total if total > 0 and whole_ms > 0 else 1.0


@contextlib.contextmanager
def _on_device(device: torch.device) -> Iterator[None]:
    """Current CUDA device (events record on its stream), cudnn autotuning, and an RNG left as found."""
    if device.type != "cuda":
        with torch.random.fork_rng(devices=[]):
            yield
        return
    previous_benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # as the trainer runs (trainer.cudnn_benchmark defaults to True)
    try:
        # manual_seed reseeds every GPU, so every GPU's generator is saved and restored.
        with torch.cuda.device(device), torch.random.fork_rng(devices=range(torch.cuda.device_count())):
            yield
    finally:
        torch.backends.cudnn.benchmark = previous_benchmark


def _compute_setup(request: ProfileRequest, device: torch.device) -> ComputeSetup:
    autocast = torch.bfloat16 if request.dtype == "bf16" else None
    conv_net = model_spec(request.model_name).family != "vit"
    return ComputeSetup(device, autocast, channels_last=device.type == "cuda" and conv_net)


def _build_model(context: MeasureContext) -> nn.Module:
    request = context.request
    torch.manual_seed(0)
    with torch.device(context.device):  # initialise on the GPU: a ViT-L initialised on CPU takes seconds
        model = build_model(request.model_name, num_classes=request.num_classes, in_chans=request.in_chans,
                            img_size=request.image_size)
    model = context.setup.prepare_model(model)
    if request.is_teacher:
        return model.eval().requires_grad_(False)
    return model.train()


def _random_images(context: MeasureContext) -> torch.Tensor:
    request = context.request
    generator = torch.Generator().manual_seed(0)
    shape = (request.micro_batch, request.in_chans, request.image_size, request.image_size)
    return context.setup.prepare_input(torch.randn(shape, generator=generator))


def _row(index: int, size: BlockSizes, medians: _Medians) -> BlockProfile:
    return BlockProfile(
        layer=f"layer{index}", forward_time_ms=medians.forward_ms[index],
        backward_time_ms=medians.backward_ms[index],
        input_activation_size_kb=size.input_bytes / BYTES_PER_KB,
        output_activation_size_kb=size.output_bytes / BYTES_PER_KB,
        accum_activation_size_kb=size.accum_bytes / BYTES_PER_KB,
        parameter_size_kb=size.parameter_bytes / BYTES_PER_KB)


def _details(context: MeasureContext, hardware: str, medians: _Medians, elapsed_s: float) -> ProfileDetails:
    request = context.request
    # as measured, before any scaling: forward_ratio says how far the blocks were from the whole
    blocks_forward = sum(medians.forward_ms) / medians.forward_scale
    blocks_backward = sum(medians.backward_ms) / medians.backward_scale
    if request.is_teacher:
        accum_method = "cuda_peak_memory" if context.device.type == "cuda" else "output_size"
    else:
        accum_method = "saved_tensors"
    return ProfileDetails(
        model_name=request.model_name, role=request.role, micro_batch=request.micro_batch, dtype=request.dtype,
        device=str(context.device), device_name=hardware, torch_version=torch.__version__,
        timm_version=timm.__version__, image_size=request.image_size, in_chans=request.in_chans,
        num_classes=request.num_classes, warmup=request.warmup, repeats=request.repeats,
        channels_last=context.setup.channels_last, accum_method=accum_method,
        num_blocks=len(medians.forward_ms), blocks_forward_ms=blocks_forward, blocks_backward_ms=blocks_backward,
        whole_forward_ms=medians.whole_forward_ms, whole_backward_ms=medians.whole_backward_ms,
        forward_ratio=_ratio(blocks_forward, medians.whole_forward_ms),
        backward_ratio=None if request.is_teacher else _ratio(blocks_backward, medians.whole_backward_ms),
        elapsed_s=elapsed_s, measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        launch=medians.launch, block_scale_forward=medians.forward_scale,
        block_scale_backward=medians.backward_scale, block_timing=medians.block_timing)


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else float("nan")
