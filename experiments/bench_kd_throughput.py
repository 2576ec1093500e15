# python experiments/bench_kd_throughput.py --teacher resnet_mini --student resnet_micro --image-size 32 --batch 64 --steps 20 --device cpu --out experiments/results/bench_kd_throughput_cpu.json  # noqa: E501 (a command to copy)
"""KD throughput of Synapse's single-device trainer against a minimal hand-written PyTorch loop.

Both sides distil the same teacher into the same student architecture, on the same device, with
the same batch, precision and KD loss, in one process. They run in alternating segments (the
side that goes first alternates too), so drifts of the machine hit both equally; each segment's
throughput (images/s) is recorded and the medians and their ratio (trainer / hand) reported.

Two comparisons:

* ``step``: data fairness by construction: one synthetic batch, already on the device (channels
  last on CUDA), fed to both. The trainer side is the real ``SingleDeviceStep`` that
  ``build_trainer`` builds (micro-batch split, KD loss, AdamW, LR schedule); the hand side is
  teacher forward under ``no_grad`` + student forward/backward + AdamW step + the same KD loss.
* ``loop``: the real ``Trainer.fit`` loop (sampler, batch generation, host-to-device copy,
  metrics JSONL, progress hooks) against the hand loop fed by the same data path
  (``synapse.engine.batches.train_batches`` over the same synthetic data set). Checkpoints are
  disabled on the trainer side (the hand loop writes none); no evaluation falls in a segment.

The hand loop is an honest baseline: on CUDA it uses bf16 autocast, channels_last and
``cudnn.benchmark=True``; on CPU fp32; AdamW with torch's default implementation (as the
trainer), or ``--hand-fused-adamw`` to give it the fused kernel the trainer does not use.

On a GPU, segments need to be long (short ones are dominated by clock ramp-up and noise), and
``loop`` mostly measures the host generating 224x224 synthetic images, equally for both sides:

    python experiments/bench_kd_throughput.py --teacher vit_base --student resnet50 --image-size 224 \
        --batch 64 --steps 100 --segments 7 --warmup-segments 2 --device cuda \
        --out experiments/results/bench_kd_throughput_h200.json
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # runnable from a checkout without `pip install -e .`

from synapse.config import typed_config, validate  # noqa: E402
from synapse.data import (
    ResumableSampler,  # noqa: E402
    build_datasets,  # noqa: E402
)
from synapse.engine import (  # noqa: E402  # noqa: E402
    Batch,
    Trainer,
    build_compute_setup,  # noqa: E402
    build_trainer,
    kd_params,
    prepare_teacher,  # noqa: E402
    train_batches,
)
from synapse.kd import kd_loss  # noqa: E402
from synapse.models import build_model  # noqa: E402

CONF_DIR = REPO_ROOT / "conf"
MODES = ("step", "loop")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", default="resnet_mini")
    parser.add_argument("--student", default="resnet_micro")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per segment")
    parser.add_argument("--segments", type=int, default=5, help="measured segments per side and mode")
    parser.add_argument("--warmup-segments", type=int, default=1, help="unrecorded segments per side first")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="auto: bf16 autocast on CUDA, fp32 on CPU (both sides)")
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (both sides)")
    parser.add_argument("--modes", default="step,loop", help="comma-separated subset of step,loop")
    parser.add_argument("--hand-fused-adamw", action="store_true", help="fused AdamW in the hand loop (CUDA)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write the results to")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.modes if m not in MODES]
    if bad or min(args.batch, args.steps, args.segments) < 1 or args.warmup_segments < 0:
        parser.error(f"need --modes from {MODES} (got {bad}), --batch, --steps, --segments >= 1 and "
                     f"--warmup-segments >= 0")
    return args


def quiet(line: str) -> None:
    pass


# ----------------------------------------------------------------------------- the trainer side

def compose_config(args: argparse.Namespace, run_dir: Path, teacher_file: Path) -> DictConfig:
    """The config ``python train.py`` would compose for this benchmark, validated."""
    segments = args.segments + args.warmup_segments
    total_batches = (args.steps + 1) * segments + 4  # a trainer loop segment never reaches an epoch end
    overrides = [
        f"run_dir={run_dir}", f"teacher={args.teacher}", f"student={args.student}", "data=synthetic",
        f"data.image_size={args.image_size}", f"data.batch_size={args.batch}", f"data.val_batch_size={args.batch}",
        f"data.synthetic_num_classes={args.num_classes}", f"data.synthetic_train_size={args.batch * total_batches}",
        f"data.synthetic_val_size={args.batch}", f"trainer.accelerator={args.device}", "trainer.devices=1",
        f"trainer.precision={args.precision}", f"trainer.max_steps={10 * total_batches}", "trainer.progress=false",
        "pipeline.microbatches=1", f"teacher.checkpoint={teacher_file}", "teacher.auto_train=false",
    ]
    if args.threads:
        overrides.append(f"trainer.threads={args.threads}")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="bench_kd_throughput"):
        cfg = compose(config_name="config", overrides=overrides)
    validate(cfg)
    return typed_config(cfg)


def build_trainer_side(cfg: DictConfig, run_dir: Path) -> Trainer:
    """Exactly what ``synapse.app.run_kd`` builds, minus checkpoint writing."""
    setup = build_compute_setup(cfg.trainer)
    teacher = prepare_teacher(cfg, run_dir, setup, log=quiet)
    trainer = build_trainer(cfg, run_dir, cfg.student.name, teacher, None, log=quiet)
    trainer.save_checkpoint = lambda *args, **kwargs: None  # the hand loop writes none either
    return trainer


def trainer_loop_segment(trainer: Trainer, steps: int) -> None:
    trainer.settings = dataclasses.replace(trainer.settings, stop_after=steps)  # fit() returns after this many steps
    trainer.fit()


# ----------------------------------------------------------------------------- the hand-written side

class HandWrittenKD:
    """A minimal KD loop as one writes it with plain PyTorch; same models, loss and optimizer settings."""

    def __init__(self, cfg: DictConfig, teacher_file: Path, device: torch.device, bf16: bool,
                 fused_adamw: bool):
        self.cfg = cfg  # its data path reads the trainer's data settings (hand_batches)
        channels_last = device.type == "cuda"
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.device, self.bf16 = device, bf16
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        info = dict(num_classes=cfg.data.synthetic_num_classes, in_chans=cfg.data.synthetic_in_chans,
                    img_size=cfg.data.image_size)
        teacher = build_model(cfg.teacher.name, **info)
        teacher.load_state_dict(torch.load(teacher_file, map_location="cpu", weights_only=True))
        self.teacher = teacher.to(device, memory_format=self.memory_format).eval().requires_grad_(False)
        self.student = build_model(cfg.student.name, **info).to(device, memory_format=self.memory_format).train()
        self.optimizer = torch.optim.AdamW(self.student.parameters(), lr=cfg.optim.lr,
                                           weight_decay=cfg.optim.weight_decay, fused=fused_adamw or None)
        self.kd = kd_params(cfg.kd)  # the same mode, T and lambda as the trainer

    def _autocast(self):
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), self._autocast():
            teacher_logits = self.teacher(images)
        with self._autocast():
            loss = kd_loss(self.student(images), teacher_logits, labels, self.kd)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def to_device(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        images = batch.images.to(self.device, non_blocking=True).contiguous(memory_format=self.memory_format)
        return images, batch.labels.to(self.device, non_blocking=True)


def hand_batches(cfg: DictConfig) -> Iterator[Batch]:
    """The trainer's data path over its own copy of the synthetic data set."""
    train_ds, _ = build_datasets(cfg.data, cfg.seed)
    sampler = ResumableSampler(len(train_ds), cfg.seed, shuffle=True, drop_last=True, batch_size=cfg.data.batch_size)
    return train_batches(train_ds, sampler, num_epochs=10**6, num_workers=cfg.data.num_workers)


# ----------------------------------------------------------------------------- measurement

def synchronizer(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def images_per_second(run_segment: Callable[[], None], images: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    run_segment()
    sync()
    return images / (time.perf_counter() - start)


def interleave(sides: dict[str, Callable[[], None]], images: int, args: argparse.Namespace,
               sync: Callable[[], None]) -> dict[str, list[float]]:
    """Unrecorded warm-up segments for each side, then ``args.segments`` alternating recorded ones."""
    for _ in range(args.warmup_segments):
        for run_segment in sides.values():
            run_segment()
    results: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for i in range(args.segments):
        for name in names if i % 2 == 0 else reversed(names):
            results[name].append(images_per_second(sides[name], images, sync))
    return results


def summarize(results: dict[str, list[float]], data: str) -> dict:
    trainer, hand = statistics.median(results["trainer"]), statistics.median(results["hand"])
    return {"data": data, "trainer_images_per_s": results["trainer"], "hand_images_per_s": results["hand"],
            "trainer_median": trainer, "hand_median": hand, "ratio_trainer_over_hand": trainer / hand}


def measure_step(trainer: Trainer, hand: HandWrittenKD, args: argparse.Namespace) -> dict:
    device = trainer.runner.step_fn.setup.device
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=generator)
    images = images.to(device).contiguous(memory_format=hand.memory_format)
    labels = torch.randint(args.num_classes, (args.batch,), generator=generator).to(device)

    def trainer_segment() -> None:
        for _ in range(args.steps):
            trainer.runner.step_fn(images, labels)

    def hand_segment() -> None:
        for _ in range(args.steps):
            hand.step(images, labels)

    results = interleave({"trainer": trainer_segment, "hand": hand_segment}, args.batch * args.steps, args,
                         synchronizer(device))
    return summarize(results, "one synthetic batch resident on the device, the same tensors for both sides")


def measure_loop(trainer: Trainer, hand: HandWrittenKD, args: argparse.Namespace) -> dict:
    batches = hand_batches(hand.cfg)

    def hand_segment() -> None:
        for _ in range(args.steps):
            hand.step(*hand.to_device(next(batches)))

    sides = {"trainer": lambda: trainer_loop_segment(trainer, args.steps), "hand": hand_segment}
    results = interleave(sides, args.batch * args.steps, args, synchronizer(trainer.runner.step_fn.setup.device))
    return summarize(results, "synthetic images generated on the host per step by the same data path "
                              "(synapse.engine.batches.train_batches), copied to the device by each side")


# ----------------------------------------------------------------------------- main

def save_random_teacher(args: argparse.Namespace, path: Path) -> Path:
    torch.manual_seed(0)
    teacher = build_model(args.teacher, args.num_classes, 3, args.image_size)
    torch.save(teacher.state_dict(), path)
    return path


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def run_benchmark(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_kd_") as tmp:
        tmp_dir = Path(tmp)
        teacher_file = save_random_teacher(args, tmp_dir / "teacher.pt")
        cfg = compose_config(args, tmp_dir / "run", teacher_file)
        trainer = build_trainer_side(cfg, tmp_dir / "run")
        setup = trainer.runner.step_fn.setup
        hand = HandWrittenKD(cfg, teacher_file, setup.device, setup.autocast_dtype == torch.bfloat16,
                             args.hand_fused_adamw)
        modes = {"step": measure_step, "loop": measure_loop}
        results = {mode: modes[mode](trainer, hand, args) for mode in args.modes}
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "teacher": args.teacher, "student": args.student, "batch": args.batch, "image_size": args.image_size,
        "num_classes": args.num_classes, "steps_per_segment": args.steps, "segments": args.segments,
        "warmup_segments": args.warmup_segments,
        "device": device_description(setup.device), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "precision": "bf16 autocast" if setup.autocast_dtype == torch.bfloat16 else "fp32",
        "channels_last": setup.channels_last, "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "trainer_microbatches": cfg.pipeline.microbatches, "hand_fused_adamw": args.hand_fused_adamw,
        "kd": {"mode": cfg.kd.mode, "T": cfg.kd.T, "lambda_kd": cfg.kd.lambda_kd}, "modes": results,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = run_benchmark(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{report['teacher']} -> {report['student']}, batch {report['batch']}, {report['image_size']}px, "
          f"{report['device']}, {report['precision']}")
    for mode, result in report["modes"].items():
        print(f"  {mode:4s}: trainer {result['trainer_median']:9.1f} img/s, hand {result['hand_median']:9.1f} img/s, "
              f"ratio {result['ratio_trainer_over_hand']:.3f}")
    print(f"results written to {args.out}")


if __name__ == "__main__":
    main()
