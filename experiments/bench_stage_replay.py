"""Stage replay on one GPU: each stage of the planner's K-stage plans, run alone with its real
input shapes, eager vs CUDA-graphed, against its device time and the planner's prediction.

    python experiments/bench_stage_replay.py --pairs vit_large:resnet152,vit_base:resnet50 \
        --ks 2,3,4 --micro 16,32,64,128 --out experiments/results/h200/stage_replay

Per (pair, micro-batch): the planner's profiles at that micro-batch (measured once, cached
like a run's), its K-stage plans. Per stage: a FusedStage of the plan's blocks; one iteration
is the teacher forward (no grad) plus the student forward and backward (gradient of ones at
the student output), as in a pipeline step. Times are per iteration, medians over
``--repeats`` groups of ``--iters`` back-to-back iterations (CUDA events around each group,
so the host runs ahead where it can), with the quartiles as spread:

- eager: the stage as torch runs it without graphs (bf16 autocast, channels_last, cudnn.benchmark);
- graphed: the same stage through ``synapse.pipeline.graphs`` (one slot: the iterations are serial);
- device: the sum of the GPU kernels' durations in one eager iteration (torch.profiler), the
  floor no launch strategy can beat;
- predicted graphed / eager: the planner's stage compute per micro-batch for that stage, from
  block profiles measured as replayed graphs (``launch=graphed``, what a run with
  pipeline.cuda_graphs plans with) and as eager sweeps (``launch=eager``).

From the replays, the plan's predicted pipeline throughput at K: batch / (M + K - 1) x the
slowest stage (graphed), with M = 2K micro-batches per step, against one GPU running the whole
models at the full batch (the K = 1 replay of the same micro-batch size x M, graphed).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from synapse.models import build_model, model_blocks
from synapse.partitioning import DeviceFacts, StagePlanner, StepSpec, load_profile_csv
from synapse.pipeline import FusedStage, StageGraphs, to_wire
from synapse.profiling import profile_for_config


def quartiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "n": len(values)}


def boundary_inputs(blocks, images: torch.Tensor) -> list[torch.Tensor]:
    """The activation entering each block (and the output at the end), computed once, no grad."""
    acts = [images]
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        for block in blocks:
            acts.append(block(acts[-1]).contiguous())
    return acts


def time_iterations(step, iters: int, repeats: int) -> dict[str, float]:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return quartiles(samples)


KERNEL_ITERATIONS = 3  # profiled iterations per kernel summary


def kernel_events(step) -> list:
    """torch.profiler's per-kernel totals over ``KERNEL_ITERATIONS`` iterations after one untimed."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(KERNEL_ITERATIONS):
            step()
        torch.cuda.synchronize()
    return [e for e in prof.key_averages() if e.self_device_time_total > 0]


def device_ms(step) -> float:
    """GPU kernel time of one iteration, summed (what the GPU must do, whatever the launch cost)."""
    return sum(e.self_device_time_total for e in kernel_events(step)) / KERNEL_ITERATIONS / 1e3


def stage_iteration(stage: FusedStage, teacher_in: torch.Tensor, student_in: torch.Tensor):
    grad = None

    def step():
        nonlocal grad
        # gradients accumulate across iterations, as across a step's micro-batches (zeroed once per step)
        with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
            args = (teacher_in,) if stage.is_first else (teacher_in, student_in.requires_grad_(True))
            _, out = stage(*args)
        if grad is None:
            grad = torch.ones_like(out)
        out.backward(grad)
    return step


def replay_stage(t_blocks, s_blocks, t_acts, s_acts, t_range, s_range, first, iters, repeats) -> dict:
    # as a pipeline on the GPU builds it: the student's 4-D activations travel channels_last (pipeline.wire)
    stage = FusedStage([t_blocks[i] for i in t_range], [s_blocks[i] for i in s_range], is_first=first,
                       channels_last_wire=True)
    t_in = t_acts[t_range[0]] if not first else t_acts[0]
    s_in = to_wire(s_acts[s_range[0]], True).detach().clone() if not first else t_acts[0]
    step = stage_iteration(stage, t_in, s_in)
    result = {"eager_ms": time_iterations(step, iters, repeats), "device_ms": device_ms(step)}
    stage.graphs = StageGraphs(stage, slots=1)
    started = time.perf_counter()
    step()
    torch.cuda.synchronize()
    result["capture_s"] = time.perf_counter() - started
    result["graphed_ms"] = time_iterations(step, iters, repeats)
    result["captured"] = stage.graphs.captures == 1 and not stage.graphs.failed
    stage.graphs = None
    gc.collect()
    torch.cuda.empty_cache()
    return result


def ranges(counts) -> list[range]:
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


def pair_blocks(teacher_name: str, student_name: str, micro: int):
    """Both models' blocks on the GPU (seeded; the student channels_last) and each block's input."""
    torch.manual_seed(0)
    teacher = build_model(teacher_name, 1000).cuda().eval()
    student = build_model(student_name, 1000).cuda().to(memory_format=torch.channels_last)
    t_blocks, s_blocks = model_blocks(teacher), model_blocks(student)
    images = torch.randn(micro, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    return t_blocks, s_blocks, boundary_inputs(t_blocks, images), boundary_inputs(s_blocks, images)


def run_pair(teacher_name: str, student_name: str, micro: int, ks: list[int], args, log) -> list[dict]:
    t_blocks, s_blocks, t_acts, s_acts = pair_blocks(teacher_name, student_name, micro)
    planners = {}
    for launch in ("eager", "graphed"):
        paths = profile_for_config(teacher_name, student_name, micro, "bf16", "cuda:0", 1000, 3, 224,
                                   args.cache_dir, log=log, launch=launch)
        planners[launch] = lambda k, p=paths: StagePlanner(load_profile_csv(p.teacher), load_profile_csv(p.student),
                                                           StepSpec(2 * k), DeviceFacts("cuda:{}".format))
    rows = []
    for k in ks:
        # the plan a run with pipeline.cuda_graphs makes (graphed profiles); eager's prediction of the same cuts
        plan = planners["graphed"](k).full_plan(list(range(k)))
        eager_plan = planners["eager"](k).predict(list(range(k)), plan.teacher_counts, plan.student_counts)
        for rank, (t_range, s_range) in enumerate(zip(ranges(plan.teacher_counts), ranges(plan.student_counts))):
            measured = replay_stage(t_blocks, s_blocks, t_acts, s_acts, t_range, s_range, rank == 0,
                                    args.iters, args.repeats)
            row = {"pair": f"{teacher_name}->{student_name}", "micro_batch": micro, "K": k, "stage": rank,
                   "teacher_blocks": [t_range.start, t_range.stop], "student_blocks": [s_range.start, s_range.stop],
                   "predicted_ms": plan.stage_compute_s[rank] * 1e3,
                   "predicted_eager_ms": eager_plan.stage_compute_s[rank] * 1e3, **measured}
            rows.append(row)
            log(f"{row['pair']} mb={micro} K={k} stage {rank}: eager {measured['eager_ms']['median']:.2f} "
                f"graphed {measured['graphed_ms']['median']:.2f} device {measured['device_ms']:.2f} "
                f"predicted graphed {row['predicted_ms']:.2f} eager {row['predicted_eager_ms']:.2f} ms")
    del t_blocks, s_blocks, t_acts, s_acts
    gc.collect()  # the stages' graphs sit in reference cycles: free their memory pools before the next size
    torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| pair | mb | K | stage | eager ms | predicted eager | graphed ms (q1-q3) | device ms | graphed/device | "
             "predicted graphed | predicted/graphed | capture s |", "|" + " --- |" * 12]
    for r in rows:
        g = r["graphed_ms"]
        lines.append(f"| {r['pair']} | {r['micro_batch']} | {r['K']} | {r['stage']} | {r['eager_ms']['median']:.2f} | "
                     f"{r['predicted_eager_ms']:.2f} | "
                     f"{g['median']:.2f} ({g['q1']:.2f}-{g['q3']:.2f}) | {r['device_ms']:.2f} | "
                     f"{g['median'] / r['device_ms']:.2f} | {r['predicted_ms']:.2f} | "
                     f"{r['predicted_ms'] / g['median']:.2f} | {r['capture_s']:.1f} |")
    return "\n".join(lines)


def pipeline_estimates(rows: list[dict], batch: int) -> list[dict]:
    """Per pair, K and micro-batch size: the 1F1B step of the plan from its stage replays,
    (M + K - 1) x the slowest graphed stage with M = batch / micro-batch (communication left out:
    on NVLink a stage boundary's activation moves in well under a millisecond)."""
    out = []
    keys = sorted({(r["pair"], r["K"], r["micro_batch"]) for r in rows})
    for pair, k, micro in keys:
        stages = [r for r in rows if (r["pair"], r["K"], r["micro_batch"]) == (pair, k, micro)]
        if len(stages) != k or batch % micro:
            continue
        m = batch // micro
        slowest = max(r["graphed_ms"]["median"] for r in stages)
        step_ms = (m + k - 1) * slowest
        out.append({"pair": pair, "K": k, "micro_batch": micro, "microbatches": m, "slowest_stage_ms": slowest,
                    "step_ms": step_ms, "images_per_s": batch / step_ms * 1e3})
    return out


def estimates_markdown(estimates: list[dict], single: dict[str, float]) -> str:
    lines = ["| pair | K | micro-batch | M | slowest stage ms | step ms | img/s | vs one GPU |", "|" + " --- |" * 8]
    for e in estimates:
        base = single.get(e["pair"])
        ratio = f"{e['images_per_s'] / base:.2f}" if base else "-"
        lines.append(f"| {e['pair']} | {e['K']} | {e['micro_batch']} | {e['microbatches']} | "
                     f"{e['slowest_stage_ms']:.2f} | {e['step_ms']:.1f} | {e['images_per_s']:.0f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default="vit_large:resnet152,vit_base:resnet50")
    parser.add_argument("--ks", default="1,2,3,4")
    parser.add_argument("--micro", default="16,32,64,128")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cache-dir", default="/tmp/synapse_cache")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summarize", type=Path, help="only write the pipeline estimates of an earlier result JSON")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--single", default="", help="pair=img/s of the single-GPU trainer, comma separated")
    args = parser.parse_args()
    if args.summarize:
        rows = json.loads(args.summarize.read_text())["rows"]
        single = {p: float(v) for p, v in (item.split("=") for item in args.single.split(",") if item)}
        estimates = pipeline_estimates(rows, args.batch)
        (args.out / "pipeline_estimates.json").write_text(json.dumps(estimates, indent=1))
        (args.out / "pipeline_estimates.md").write_text(estimates_markdown(estimates, single) + "\n")
        return
    torch.backends.cudnn.benchmark = True
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for pair in args.pairs.split(","):
        teacher_name, student_name = pair.split(":")
        for micro in (int(m) for m in args.micro.split(",")):
            rows += run_pair(teacher_name, student_name, micro, [int(k) for k in args.ks.split(",")], args,
                             lambda line: print(line, flush=True))
            (args.out / "stage_replay.json").write_text(json.dumps({"device": torch.cuda.get_device_name(0),
                                                                     "torch": torch.__version__, "rows": rows},
                                                                    indent=1))
            (args.out / "stage_replay.md").write_text(markdown(rows) + "\n")


if __name__ == "__main__":
    main()
