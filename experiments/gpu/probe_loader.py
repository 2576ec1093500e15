# python experiments/gpu/probe_loader.py OUT_DIR [--tree DIR] [--parts workers,finish,threads,loader,host4,profile]
"""Where does the loader's time go on one GPU (a probe, not a benchmark)?

The loader alone (224 px, RandomResizedCrop + flip, ImageNet-size JPEGs, nvJPEG in the training
process) delivered 7,300-7,650 img/s with 8 workers, while torchvision's batched nvJPEG alone
decodes about 14,800 img/s. Each part of the path is timed alone, on the same files:

workers: the DataLoader alone (file bytes and crop draws, collated and pinned), no device work.
finish:  the training process's half alone on batches already in memory: decode only, then
         decode + crop + normalise (``dataset.device_batch``), on one thread.
threads: the same finishing on 2 and 3 threads at once, each on its own CUDA stream (does the
         decode let go of the interpreter lock, and does the GPU overlap them?).
loader:  the whole loader (``train_batches``: workers, pinning, the prefetch thread) at 4 and 8
         workers.
host4:   four processes on the one GPU at once, 2 workers each, as four ranks of a 4-GPU host
         would share 8 workers (here they also share one GPU, so the sum is a floor).
profile: the finishing half per operator (torch.profiler), and the crop alone on decoded images.
e2e:     the eager KD loop (ViT-B/16 -> ResNet-50 @128) fed by the loader with nvJPEG, 1 or 2 finishing
         threads, against the same loop on a resident batch.
(loader, host4 and e2e compare 1 and 2 finishing threads, ``train_batches(finishers=...)``. The
GPU's JPEG engines through nvImageCodec were compared with this probe at commit 66b1b8a.)

Images/s over wall-clock per timed window, after a warm-up; each figure with its n and spread.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "experiments"))

BATCH = 256


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def dataset(tree: Path):
    from synapse.data import ImageNet100
    data = ImageNet100(tree, "train", image_size=224, seed=0, decode="gpu", gpu_share=1.0)
    data.bind_device(torch.device("cuda"))
    return data


def host_loader(data, workers: int):
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    from synapse.engine.batches import loader_processes

    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return len(data)

        def __getitem__(self, index):
            return data.host_item(index)

    sampler = BatchSampler(RandomSampler(range(len(data)), num_samples=20 * len(data),
                                         generator=torch.Generator().manual_seed(0)),
                           BATCH, drop_last=True)
    return DataLoader(Items(), batch_sampler=sampler, num_workers=workers, collate_fn=data.host_collate,
                      pin_memory=True, **loader_processes())


def probe_workers(tree: Path) -> dict:
    data, result = dataset(tree), {}
    for workers in (4, 8):
        stream = iter(host_loader(data, workers))
        for _ in range(2 * workers + 2):
            next(stream)
        rates = []
        for _ in range(4):
            started = time.perf_counter()
            for _ in range(6):
                next(stream)
            rates.append(6 * BATCH / (time.perf_counter() - started))
        result[f"{workers}_workers"] = spread(rates)
        del stream
    return result


def cached_batches(tree: Path, count: int) -> tuple:
    data = dataset(tree)
    stream = iter(host_loader(data, 8))
    batches = [next(stream) for _ in range(count)]
    del stream
    return data, batches


def probe_finish(tree: Path) -> dict:
    from synapse.data.jpeg import decode_many
    data, batches = cached_batches(tree, 12)
    device = torch.device("cuda")
    result = {}
    for name, work in (("decode_only", lambda b: decode_many(b.encoded_files(), device)),
                       ("decode_crop_normalise", lambda b: data.device_batch(b, device))):
        work(batches[0])
        torch.cuda.synchronize()
        rates = []
        for _ in range(3):
            started = time.perf_counter()
            for b in batches:
                work(b)
            torch.cuda.synchronize()
            rates.append(len(batches) * BATCH / (time.perf_counter() - started))
        result[name] = spread(rates)
    return result


def probe_threads(tree: Path) -> dict:
    data, batches = cached_batches(tree, 12)
    device = torch.device("cuda")
    result = {}
    for threads in (1, 2, 3):
        streams = [torch.cuda.Stream(device) for _ in range(threads)]

        def run(k: int, threads: int = threads, streams: list = streams) -> None:
            with torch.cuda.stream(streams[k]):
                for b in batches[k::threads]:
                    data.device_batch(b, device)
            streams[k].synchronize()

        rates = []
        for _ in range(3):
            workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
            started = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            rates.append(len(batches) * BATCH / (time.perf_counter() - started))
        result[f"{threads}_threads"] = spread(rates)
    return result


def probe_profile(tree: Path) -> dict:
    """Host and device time of the finishing half, per operator (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    from synapse.data.crops import resized_crops
    from synapse.data.jpeg import decode_many
    data, batches = cached_batches(tree, 6)
    device = torch.device("cuda")
    decoded = [decode_many(b.encoded_files(), device) for b in batches]
    draws = [b.encoded_draws() for b in batches]
    torch.cuda.synchronize()
    started = time.perf_counter()
    for images, d in zip(decoded, draws):
        resized_crops(images, d, 224)
    torch.cuda.synchronize()
    crop_rate = len(batches) * BATCH / (time.perf_counter() - started)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches[:3]:
            data.device_batch(b, device)
        torch.cuda.synchronize()
    table = prof.key_averages()
    text = (table.table(sort_by="self_cpu_time_total", row_limit=25) + "\n"
            + table.table(sort_by="self_cuda_time_total", row_limit=15))
    return {"crop_only_img_s": crop_rate, "table": text}


def loader_rates(tree: Path, workers: int, windows: int = 4, per_window: int = 6, finishers: int = 1) -> dict:
    from synapse.data import ResumableSampler
    from synapse.engine import BadSampleLog, train_batches
    data = dataset(tree)
    sampler = ResumableSampler(len(data), seed=0, batch_size=BATCH, drop_last=True)
    stream = train_batches(data, sampler, 10**6, num_workers=workers, device="cuda", bad_samples=BadSampleLog(),
                           finishers=finishers)
    for _ in range(2 * workers + 4):
        next(stream)
    torch.cuda.synchronize()
    rates = []
    checksum = torch.zeros((), device="cuda")
    for _ in range(windows):
        started = time.perf_counter()
        for _ in range(per_window):
            checksum += next(stream).images[:, :, 0, 0].sum()
        torch.cuda.synchronize()
        rates.append(per_window * BATCH / (time.perf_counter() - started))
    stream.close()
    return spread(rates)


def probe_loader(tree: Path) -> dict:
    return {f"{w}_workers_{f}_finishers": loader_rates(tree, w, finishers=f) for w in (2, 4, 8) for f in (1, 2)}


def probe_e2e(tree: Path) -> dict:
    """ViT-B/16 -> ResNet-50 @128, the eager loop fed by the loader (nvJPEG in the process) against the
    same loop on a resident batch; rounds interleaved. 2 workers is a rank of a 16-core 4-GPU host."""
    from benchlib import EagerKDLoop

    from synapse.data import ResumableSampler
    from synapse.engine import BadSampleLog, train_batches
    torch.backends.cudnn.benchmark = True
    loop = EagerKDLoop("vit_base", "resnet50", 128, fused=True)
    resident = (loop.images, loop.labels)
    variants = {"resident": None, **{f"{w}_workers_{f}_finishers": (w, f) for w in (2, 8) for f in (1, 2)}}
    result: dict = {name: [] for name in variants}
    warm, timed = 12, 40
    for _round in range(2):
        for name, setting in variants.items():
            stream = None
            if setting is not None:
                data = dataset(tree)
                sampler = ResumableSampler(len(data), seed=0, batch_size=128, drop_last=True)
                stream = train_batches(data, sampler, 10**6, num_workers=setting[0], device="cuda",
                                       bad_samples=BadSampleLog(), finishers=setting[1])
            for step in range(warm + timed):
                if step == warm:
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                if stream is None:
                    loop.images, loop.labels = resident
                else:
                    batch = next(stream)
                    loop.images = batch.images.contiguous(memory_format=torch.channels_last)
                    loop.labels = batch.labels
                loop.step()
            torch.cuda.synchronize()
            result[name].append(timed * 128 / (time.perf_counter() - started))
            if stream is not None:
                stream.close()
    summary = {name: spread(rates) for name, rates in result.items()}
    base = summary["resident"]["median"]
    for name in variants:
        summary[name]["ratio_to_resident"] = summary[name]["median"] / base
    return summary


def _host_rank(tree: str, workers: int, start, queue) -> None:
    start.wait()
    queue.put({f"{f}_finishers": loader_rates(Path(tree), workers, windows=3, finishers=f) for f in (1, 2)})


def probe_host4(tree: Path) -> dict:
    context = mp.get_context("spawn")
    start, queue = context.Event(), context.Queue()
    ranks = [context.Process(target=_host_rank, args=(str(tree), 2, start, queue)) for _ in range(4)]
    for r in ranks:
        r.start()
    start.set()
    results = [queue.get(timeout=600) for _ in ranks]
    for r in ranks:
        r.join()
    return {"per_rank": results, **{f"sum_of_medians_{f}_finishers": sum(r[f"{f}_finishers"]["median"] for r in results)
                                    for f in (1, 2)}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tree", type=Path, default=Path("/tmp/bench_jpeg_tree"))
    parser.add_argument("--parts", default="workers,finish,threads,loader,host4")
    args = parser.parse_args()
    from bench_data_path import make_tree
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"tree": make_tree(args.tree, 100), "batch": BATCH, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name()}
    probes = {"profile": probe_profile, "workers": probe_workers, "finish": probe_finish, "threads": probe_threads,
              "loader": probe_loader, "host4": probe_host4, "e2e": probe_e2e}
    for part in args.parts.split(","):
        started = time.perf_counter()
        results[part] = probes[part](args.tree)
        results[part]["seconds"] = time.perf_counter() - started
        print(part, json.dumps(results[part]), flush=True)
        (args.out / "probe_loader.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
