"""Where does train.py lose its last few percent against the resident-data loop? (one GPU)

    python experiments/gpu/probe_trainer_gap.py [teacher student batch workers]

One process, one pair of models, variants interleaved round by round (so drift of a shared
GPU hits them alike), each timed as images/s over blocks of 5 steps after a warm-up:

- resident:            the bench's plain loop on one resident batch, no host sync;
- resident+lag1:       the same, reading the previous step's loss after launching a step (the
                       trainer's late loss check: the host runs at most one step ahead);
- resident+lag1, read after the backward: the lag-1 read of a value enqueued after the step's
                       backward and optimizer step (SingleDeviceStep sums its loss after the backward);
- loader:              batches from the trainer's data path (synthetic on the device, workers,
                       side-stream prefetch thread), plain loop, no sync;
- loader+step+lag1:    the trainer's data path and step object (SingleDeviceStep, late check,
                       scheduler) with the lag-1 loss read: train.py without records;
- loader+step+lag2:    the same, reading two steps late;
- loader+plain+train(): the plain loop calling ``student.train()`` every step, as the step does;
- loader+plain+rest:   the plain loop with the step's other extras (tensor_split, the loss summed
                       into a tensor, scheduler.step), without ``train()``.

On 2026-12-02 (`experiments/results/h200/probe_trainer_gap_run*.txt`): the data path and the late
read cost about 1% each; SingleDeviceStep about 4-5% more, for both pairs. The last two variants
split that cost between its parts.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.optim.lr_scheduler import LambdaLR

from synapse.data import ResumableSampler, SyntheticImages
from synapse.engine import ComputeSetup, SingleDeviceStep, train_batches
from synapse.kd import KDLossParams, kd_loss
from synapse.models import build_model

BLOCK, WARM, TIMED_BLOCKS, ROUNDS = 5, 5, 5, 3


def main() -> None:
    teacher_name, student_name = (sys.argv[1:3] if len(sys.argv) > 2 else ("vit_large", "resnet152"))
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 14
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    setup = ComputeSetup(device, torch.bfloat16, True)
    teacher = setup.prepare_model(build_model(teacher_name, 100, 3, 224)).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = setup.prepare_model(build_model(student_name, 100, 3, 224))
    optimizer = torch.optim.AdamW(student.parameters(), lr=0.002, weight_decay=5e-4)
    scheduler = LambdaLR(optimizer, lambda _: 1.0)
    params = KDLossParams("st", 4.0, 0.9)
    resident = (torch.randn(batch, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last),
                torch.randint(0, 100, (batch,), device=device))
    steps = WARM + BLOCK * TIMED_BLOCKS
    dataset = SyntheticImages("train", num_samples=batch * (steps + 2))

    def plain_step(images, labels):  # the bench's resident loop (bench_data_path.resident_rates), as is
        images = setup.prepare_input(images)
        with setup.autocast():
            with torch.no_grad():
                teacher_logits = teacher(images)
            loss = kd_loss(student(images), teacher_logits, labels, params)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def plain_step_train_mode(images, labels):
        student.train()
        return plain_step(images, labels)

    def plain_step_rest(images, labels):
        images = setup.prepare_input(images)
        total = torch.zeros((), device=device)
        for x, y in zip(torch.tensor_split(images, 1), torch.tensor_split(labels, 1)):
            with setup.autocast():
                with torch.no_grad():
                    teacher_logits = teacher(x)
                loss = kd_loss(student(x), teacher_logits, y, params)
            loss.backward()
            total += loss.detach()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return total / 1

    trainer_step = SingleDeviceStep(student, teacher, optimizer, scheduler, 1, params, setup, "stop", check_late=True)

    def batches(source_workers):
        if source_workers is None:
            while True:
                yield resident
        sampler = ResumableSampler(len(dataset), 0, shuffle=True, drop_last=True, batch_size=batch)
        for b in train_batches(dataset, sampler, 1, source_workers, load="images", device=device):
            yield b.images, b.labels

    def plain_step_read_after_backward(images, labels):
        loss = plain_step(images, labels)
        return loss * 1.0  # enqueued after the backward and the optimizer step

    def run(source_workers, step_fn, lag: int) -> list[float]:
        rates, pending = [], []
        source = batches(source_workers)
        started = time.perf_counter()
        for step in range(1, steps + 1):
            images, labels = next(source)
            loss = step_fn(images, labels, step) if step_fn is trainer_step else step_fn(images, labels)
            pending.append(loss)
            if lag and len(pending) > lag:
                float(pending.pop(0))
            if step >= WARM and (step - WARM) % BLOCK == 0:
                torch.cuda.synchronize()
                now = time.perf_counter()
                if step > WARM:
                    rates.append(BLOCK * batch / (now - started))
                started = now
        source.close()
        return rates

    variants = {
        "resident": (None, plain_step, 0),
        "resident+lag1": (None, plain_step, 1),
        "resident+lag1, loss read after the backward": (None, plain_step_read_after_backward, 1),
        f"loader ({workers} workers)": (workers, plain_step, 0),
        f"loader+step+lag1 ({workers} workers)": (workers, trainer_step, 1),
        f"loader+step+lag2 ({workers} workers)": (workers, trainer_step, 2),
        f"loader+plain+train()+lag1 ({workers} workers)": (workers, plain_step_train_mode, 1),
        f"loader+plain+rest+lag1 ({workers} workers)": (workers, plain_step_rest, 1),
    }
    results: dict[str, list[float]] = {name: [] for name in variants}
    run(None, plain_step, 0)  # cudnn.benchmark and allocator warm-up
    for _ in range(ROUNDS):
        for name, variant in variants.items():
            results[name] += run(*variant)
    base = statistics.median(results["resident"])
    print(f"{teacher_name} -> {student_name} @{batch}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}; "
          f"images/s per {BLOCK}-step block, {ROUNDS} interleaved rounds")
    print("| variant | median | q25 | q75 | n | vs resident |\n| --- | --- | --- | --- | --- | --- |")
    for name, rates in results.items():
        q = statistics.quantiles(rates, n=4)
        print(f"| {name} | {statistics.median(rates):,.0f} | {q[0]:,.0f} | {q[2]:,.0f} | {len(rates)} | "
              f"{statistics.median(rates) / base:.3f} |")


if __name__ == "__main__":
    main()
