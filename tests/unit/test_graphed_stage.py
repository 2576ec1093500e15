"""CUDA-graphed fused stages (synapse.pipeline.graphs): replays learn what eager stages learn.

The GPU cases drive one middle stage through exactly the order torch's 1F1B schedule runs it
(``min(M, K - r)`` forwards, then one backward before each further forward) with M > K, once
eagerly and once graphed, and compare every parameter gradient, the gradient sent back to the
previous stage, the outputs and the BatchNorm statistics. A control with too few slots must
differ: it shows the comparison can fail.
"""
from __future__ import annotations

import copy

import pytest
import torch

from synapse.models import build_model, model_blocks, run_blocks
from synapse.pipeline import FusedStage, StageGraphs, slots_for, to_wire

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("rank, expected", [(0, 3), (1, 2), (2, 1)])
def test_1f1b_slots_are_the_forwards_in_flight(rank, expected):
    assert slots_for("1f1b", microbatches=8, rank=rank, world_size=3) == expected


def test_slots_never_exceed_the_micro_batches():
    assert slots_for("1f1b", microbatches=2, rank=0, world_size=4) == 2
    assert slots_for("gpipe", microbatches=6, rank=1, world_size=4) == 6


def test_cpu_stage_never_captures():
    torch.manual_seed(0)
    stage = FusedStage([torch.nn.Linear(4, 4)], [torch.nn.Linear(4, 4)], is_first=True)
    stage.graphs = StageGraphs(stage, slots=2)
    x = torch.randn(3, 4)
    assert not stage.graphs.applies(x, x)
    teacher_out, student_out = stage(x)
    assert stage.graphs.captures == 0 and student_out.requires_grad


# ----------------------------------------------------------------------------- CUDA

def _middle_stage(seed: int = 0, channels_last_wire: bool = False):
    """Blocks 2-4 of a ViT teacher and a ResNet student (BatchNorm), and inputs for them (the
    student's as it travels: NCHW, or NHWC-shaped on a channels_last wire)."""
    torch.manual_seed(seed)
    teacher = build_model("vit_tiny", 10, img_size=64).cuda().eval()
    student = build_model("resnet18", 10).cuda().to(memory_format=torch.channels_last)
    t_blocks, s_blocks = model_blocks(teacher), model_blocks(student)
    stage = FusedStage(t_blocks[2:5], s_blocks[2:5], is_first=False, channels_last_wire=channels_last_wire).cuda()
    images = torch.randn(32, 3, 64, 64, device="cuda").contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        t_in = run_blocks(t_blocks[:2], images).contiguous()
        s_in = run_blocks(s_blocks[:2], images).contiguous()
    return stage, t_in.float(), to_wire(s_in.float(), channels_last_wire)


def _run_1f1b(stage: FusedStage, t_in, s_in, microbatches: int, slots: int):
    """One step of a middle stage in torch's 1F1B order; returns what the stage sends and learns."""
    t_chunks, s_chunks = t_in.chunk(microbatches), s_in.chunk(microbatches)
    inputs, outputs, sent, sent_back = {}, {}, {}, {}

    def forward(i):
        if stage.graphs is not None:
            stage.graphs.select(i)
        inputs[i] = s_chunks[i].clone().requires_grad_(True)
        outputs[i] = stage(t_chunks[i].clone(), inputs[i])
        sent[i] = outputs[i][0].float().clone()  # the teacher activation travels on right away

    def backward(i):  # the gradient the next stage sends back: fixed per micro-batch
        out = outputs[i][1]
        grad = torch.randn(out.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(i))
        torch.autograd.backward(out, grad.to(out.dtype))
        # sent to the previous stage now (the schedule waits on that send before the slot's next
        # replay, which overwrites the graph's gradient buffer the input's .grad points into)
        sent_back[i] = inputs[i].grad.clone()

    with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
        fwd = 0
        for _ in range(slots):
            forward(fwd)
            fwd += 1
        for bwd in range(microbatches):
            backward(bwd)
            if fwd < microbatches:
                forward(fwd)
                fwd += 1
    torch.cuda.synchronize()
    return {"input_grads": torch.cat([sent_back[i] for i in range(microbatches)]),
            "teacher_out": torch.cat([sent[i] for i in range(microbatches)]),
            "param_grads": [p.grad.clone() for p in stage.student.parameters()],
            "buffers": [b.clone() for b in stage.student.buffers()]}


def _max_rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


def _compare(graphed_run, eager_run) -> float:
    pairs = [(graphed_run["input_grads"], eager_run["input_grads"]),
             (graphed_run["teacher_out"], eager_run["teacher_out"])]
    pairs += list(zip(graphed_run["param_grads"], eager_run["param_grads"]))
    pairs += [(a, b) for a, b in zip(graphed_run["buffers"], eager_run["buffers"]) if a.is_floating_point()]
    return max(_max_rel_error(a, b) for a, b in pairs)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("channels_last_wire", [False, True])
def test_graphed_stage_matches_eager_under_1f1b_with_more_microbatches_than_stages(channels_last_wire):
    torch.backends.cudnn.benchmark = True
    rank, world, microbatches = 1, 4, 8  # 3 micro-batches in flight, M = 8 > K = 4
    slots = slots_for("1f1b", microbatches, rank, world)
    eager_stage, t_in, s_in = _middle_stage(channels_last_wire=channels_last_wire)
    graphed_stage = copy.deepcopy(eager_stage)
    graphed_stage.graphs = StageGraphs(graphed_stage, slots)

    eager = _run_1f1b(eager_stage, t_in, s_in, microbatches, slots)
    graphed = _run_1f1b(graphed_stage, t_in, s_in, microbatches, slots)
    assert graphed_stage.graphs.captures == slots and not graphed_stage.graphs.failed
    # bf16 tolerance: the graphed kernels are the eager ones, so they agree far closer than this
    assert _compare(graphed, eager) < 2e-2
    # a second step replays the captures: BatchNorm statistics move once per micro-batch, as eagerly
    eager2 = _run_1f1b(eager_stage, t_in, s_in, microbatches, slots)
    graphed2 = _run_1f1b(graphed_stage, t_in, s_in, microbatches, slots)
    assert graphed_stage.graphs.captures == slots
    assert _compare(graphed2, eager2) < 2e-2


@pytest.mark.gpu
@needs_cuda
def test_one_slot_for_several_micro_batches_in_flight_is_wrong():
    """The control: reusing one capture while its micro-batch still waits for its backward
    overwrites the activations that backward needs, so the check above can fail."""
    rank, world, microbatches = 1, 4, 8
    eager_stage, t_in, s_in = _middle_stage()
    graphed_stage = copy.deepcopy(eager_stage)
    graphed_stage.graphs = StageGraphs(graphed_stage, slots=1)
    in_flight = slots_for("1f1b", microbatches, rank, world)
    eager = _run_1f1b(eager_stage, t_in, s_in, microbatches, in_flight)
    graphed = _run_1f1b(graphed_stage, t_in, s_in, microbatches, in_flight)
    assert _compare(graphed, eager) > 0.1


@pytest.mark.gpu
@needs_cuda
def test_evaluation_and_no_grad_forwards_stay_eager():
    stage, t_in, s_in = _middle_stage()
    stage.graphs = StageGraphs(stage, slots=1)
    with torch.no_grad():
        stage(t_in, s_in)
    stage.eval()
    stage(t_in, s_in)
    assert stage.graphs.captures == 0


@pytest.mark.gpu
@needs_cuda
def test_pipeline_runtime_with_graphs_learns_what_it_learns_eagerly(tmp_path):
    """K = 1 through the real runtime (torch.distributed.pipelining, 1F1B, M = 4 micro-batches
    accumulating into one update), three optimizer steps, graphs on vs off."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from synapse.engine import ComputeSetup
    from synapse.pipeline import PipelineRuntime

    torch.backends.cudnn.benchmark = True
    setup = ComputeSetup(torch.device("cuda", 0), torch.bfloat16, True)
    torch.manual_seed(0)
    teacher = build_model("vit_tiny", 10, img_size=64).eval()
    student = build_model("resnet18", 10)
    images = torch.randn(3, 32, 3, 64, 64)
    labels = torch.randint(0, 10, (3, 32))

    def loss_fn(student_logits, teacher_logits, target):
        return F.cross_entropy(student_logits.float(), target) + F.mse_loss(student_logits.float(),
                                                                             teacher_logits.float())

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        learned = {}
        for graphs in (False, True):
            stage = setup.prepare_model(FusedStage(model_blocks(copy.deepcopy(teacher)),
                                                   model_blocks(copy.deepcopy(student)), is_first=True))
            optimizer = torch.optim.SGD(stage.student.parameters(), lr=0.05, momentum=0.9)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
            runtime = PipelineRuntime(stage, 0, 1, setup, 4, "1f1b", loss_fn, optimizer, scheduler,
                                      cuda_graphs=graphs)
            losses = [float(runtime.train_step(images[i], labels[i], i + 1)) for i in range(3)]
            assert (stage.graphs is not None) == graphs
            if graphs:
                assert stage.graphs.captures == 1 and not stage.graphs.failed
            learned[graphs] = (losses, [p.detach().float().clone() for p in stage.student.parameters()])
    finally:
        dist.destroy_process_group()
    initial = [p.detach().float().cuda() for p in student.parameters()]
    (eager_losses, eager), (graphed_losses, graphed) = learned[False], learned[True]
    assert graphed_losses == pytest.approx(eager_losses, rel=2e-2)
    for p0, a, b in zip(initial, graphed, eager):
        update_eager, update_graphed = b - p0, a - p0
        scale = update_eager.abs().max().clamp_min(1e-8)
        assert float((update_graphed - update_eager).abs().max() / scale) < 5e-2
