# python experiments/gpu/probe_decode_compile.py OUT_DIR [decode] [step]   (one H200; a probe, not a benchmark)
"""Two questions before building, answered on the device:

decode: how fast do torchvision's nvJPEG batch decode and nvImageCodec (hardware engines, CUDA,
    with and without decoding only the crop region) turn 256 JPEGs of 500x375 into pixels on the
    GPU, and do their pixels agree?
step:   what do the levers the eager KD step does not pull (torch.compile of the student and of the
    teacher, fused AdamW, a bf16 copy of the frozen teacher) buy on ViT-B/16 -> ResNet-50 @128 and
    ViT-L/16 -> ResNet-152 @128? Images over wall-clock across steps 15..N, per lever.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "experiments"))

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
PARTS = sys.argv[2:] or ["decode", "step"]


def save(name: str, result) -> None:
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=1))
    print(name, json.dumps(result), flush=True)


def rate(fn, n_images: int, repeats: int = 8) -> dict:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"img_s_median": n_images / times[len(times) // 2], "img_s_best": n_images / times[0],
            "img_s_worst": n_images / times[-1], "n": repeats}


def probe_decode() -> None:
    from bench_data_path import photo_jpeg
    from nvidia import nvimgcodec
    from torchvision.io import ImageReadMode, decode_jpeg

    from synapse.data.crops import crop_box, draw_train_crop

    files = [photo_jpeg(seed) for seed in range(256)]
    tensors = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
    device = torch.device("cuda")
    result = {}
    result["torchvision_nvjpeg"] = rate(lambda: decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device), 256)
    save("decode", result)
    params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB,
                                     allow_any_depth=False, sample_format=nvimgcodec.SampleFormat.P_RGB)
    kinds = {"nvimgcodec_default": None, "nvimgcodec_hw": [nvimgcodec.BackendKind.HW_GPU_ONLY],
             "nvimgcodec_cuda": [nvimgcodec.BackendKind.GPU_ONLY],
             "nvimgcodec_hybrid": [nvimgcodec.BackendKind.HYBRID_CPU_GPU]}
    draws = [draw_train_crop(7, i) for i in range(256)]
    reference = [t.cpu() for t in decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)]
    for name, kind in kinds.items():
        try:
            backends = None if kind is None else [nvimgcodec.Backend(k) for k in kind]
            decoder = nvimgcodec.Decoder(device_id=0, backends=backends)
            def whole(decoder=decoder):
                streams = [nvimgcodec.CodeStream(f) for f in files]
                return [torch.as_tensor(img, device=device) for img in decoder.decode(streams, params=params)]
            out = whole()
            diff = max(int((o.cpu().int() - r.int()).abs().max()) for o, r in zip(out, reference))
            result[name] = {**rate(whole, 256), "max_level_diff_vs_torchvision": diff,
                            "shape": list(out[0].shape), "none": sum(o is None for o in out)}

            def roi(decoder=decoder):
                streams = []
                for f, d in zip(files, draws):
                    s = nvimgcodec.CodeStream(f)
                    top, left, h, w = crop_box(d, s.height, s.width, 224)
                    streams.append(s.get_sub_code_stream(region=nvimgcodec.Region(top, left, top + h, left + w)))
                return [torch.as_tensor(img, device=device) for img in decoder.decode(streams, params=params)]
            out = roi()
            boxes = [crop_box(d, 375, 500, 224) for d in draws]
            diff = max(int((o.cpu().int() - r[:, t:t + h, lft:lft + w].int()).abs().max())
                       for o, r, (t, lft, h, w) in zip(out, reference, boxes))
            result[name + "_roi"] = {**rate(roi, 256), "max_level_diff_vs_torchvision_crop": diff}
        except Exception as error:  # a probe: record and go on
            result[name] = {"error": repr(error)[:400]}
        save("decode", result)
    # the header parse alone (what a loader worker would pay to know the size)
    t0 = time.perf_counter()
    for f in files:
        s = nvimgcodec.CodeStream(f)
        _ = (s.height, s.width)
    result["header_parse_us_per_file"] = (time.perf_counter() - t0) / len(files) * 1e6
    save("decode", result)


def probe_step() -> None:
    from synapse.kd import KDLossParams, kd_loss
    from synapse.models import build_model

    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    results = {}
    for teacher_name, student_name, steps in (("vit_base", "resnet50", 70), ("vit_large", "resnet152", 50)):
        for lever in ("eager", "fused_adamw", "teacher_bf16", "compile_student", "compile_both", "all"):
            torch.manual_seed(0)
            teacher = build_model(teacher_name, 100, 3, 224).to(device).to(memory_format=torch.channels_last).eval()
            for p in teacher.parameters():
                p.requires_grad_(False)
            if lever in ("teacher_bf16", "all"):
                teacher = teacher.to(torch.bfloat16)
            student = build_model(student_name, 100, 3, 224).to(device).to(memory_format=torch.channels_last)
            fused = lever in ("fused_adamw", "all")
            optimizer = torch.optim.AdamW(student.parameters(), lr=0.002, weight_decay=5e-4, fused=fused)
            run_student, run_teacher = student, teacher
            if lever in ("compile_student", "compile_both", "all"):
                run_student = torch.compile(student)
            if lever in ("compile_both", "all"):
                run_teacher = torch.compile(teacher)
            images = torch.randn(128, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
            labels = torch.randint(0, 100, (128,), device=device)
            params = KDLossParams("st", 4.0, 0.9)
            stamps = []
            t_start = time.perf_counter()
            try:
                for _step in range(steps):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        with torch.no_grad():
                            teacher_logits = run_teacher(images)
                        loss = kd_loss(run_student(images), teacher_logits, labels, params)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if _step in (14, steps - 5):
                        torch.cuda.synchronize()
                        stamps.append(time.perf_counter())
                    if _step == 0:
                        torch.cuda.synchronize()
                        first_s = time.perf_counter() - t_start
                window = steps - 5 - 14
                results[f"{teacher_name}->{student_name}:{lever}"] = {
                    "img_s": window * 128 / (stamps[1] - stamps[0]), "window_steps": window,
                    "first_step_s": first_s, "loss": float(loss)}
            except Exception as error:
                results[f"{teacher_name}->{student_name}:{lever}"] = {"error": repr(error)[:400]}
            save("step", results)
            del teacher, student, optimizer, run_student, run_teacher
            torch._dynamo.reset()
            torch.cuda.empty_cache()


if "decode" in PARTS:
    probe_decode()
if "step" in PARTS:
    probe_step()
