"""The device data path: decode placements agree, bad files never stop an epoch, labels-only
loading reads no image, resume replays the same images, and the prefetcher keeps order.

Runs on the CPU: ``decode="gpu"`` on a CPU device is the same code path as on CUDA (bytes
from the workers, decode and crop in the training process) with the CPU decoder. The CUDA
comparison at the end needs a GPU (marked ``gpu``).
"""
from __future__ import annotations

import io
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from synapse.data import (
    CROP_ATTEMPTS,
    IMAGENET_MEAN,
    VALIDATION_DRAW,
    CropDraw,
    DataError,
    ImageNet100,
    ResumableSampler,
    SyntheticImages,
    crop_box,
    decode_cpu,
    device_decodable,
    draw_train_crop,
    imagenet100_synsets,
    jpeg_frame,
    normalize_uint8,
    read_bytes,
    resized_crop,
    resized_crops,
    seeded_generator,
)
from synapse.engine import BadSampleLog, DataWarning, DevicePrefetcher, train_batches

SIZE = 16  # output image size of the small trees


def smooth_image(seed: int, height: int = 30, width: int = 40) -> np.ndarray:
    """A photo-like RGB image (gradients + mild noise): realistic JPEG behaviour, unlike pure noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (height + width)], axis=-1)
    return np.clip(base + rng.normal(0, 12, base.shape) + rng.integers(0, 60, 3), 0, 255).astype(np.uint8)


def jpeg_bytes(pixels: np.ndarray, mode: str = "RGB", **save) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, format=save.pop("format", "JPEG"), quality=90, **save)
    return buffer.getvalue()


def make_tree(root: Path, per_class: int = 1, classes: int = 100) -> Path:
    """ImageNet layout, all 100 synsets (the checks want them), ``per_class`` JPEGs in the first ``classes``."""
    synsets = imagenet100_synsets()
    for split in ("train", "val"):
        for n, synset in enumerate(synsets):
            folder = root / split / synset
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(per_class if n < classes else 1):
                (folder / f"{synset}_{k}.JPEG").write_bytes(jpeg_bytes(smooth_image(n * 100 + k)))
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("jpeg_tree"))


@pytest.fixture(scope="module")
def bad_tree(tmp_path_factory) -> Path:
    """The first train files replaced by each awkward case the issue names."""
    root = make_tree(tmp_path_factory.mktemp("bad_tree"))
    synsets = imagenet100_synsets()
    pixels = smooth_image(7)
    good = jpeg_bytes(pixels)
    cases = {
        0: good[: len(good) // 2],  # truncated JPEG
        1: b"<html>this is not an image</html>",  # not an image, named .JPEG
        2: jpeg_bytes(pixels, "L"),  # grey-scale JPEG
        3: jpeg_bytes(pixels, "CMYK"),  # CMYK JPEG
        4: jpeg_bytes(pixels, format="PNG"),  # a PNG named .JPEG
        5: jpeg_bytes(pixels, progressive=True),  # progressive JPEG
    }
    for n, data in cases.items():
        (root / "train" / synsets[n] / f"{synsets[n]}_0.JPEG").write_bytes(data)
    return root


def all_batches(dataset, batch_size=10, epochs=1, workers=0, seed=0, **kwargs):
    sampler = ResumableSampler(len(dataset), seed=seed, batch_size=batch_size, drop_last=True)
    return list(train_batches(dataset, sampler, epochs, num_workers=workers, **kwargs))


# ----------------------------------------------------------------------------- crops

def test_train_crop_is_a_pure_function_of_its_seed_parts():
    a, b = draw_train_crop(1, 2, 3), draw_train_crop(1, 2, 3)
    assert torch.equal(a.attempts, b.attempts) and a.flip == b.flip
    assert not torch.equal(a.attempts, draw_train_crop(1, 2, 4).attempts)
    assert a.attempts.shape == (CROP_ATTEMPTS, 4)


@pytest.mark.parametrize("height, width", [(375, 500), (500, 375), (32, 32), (7, 300), (300, 7)])
def test_crop_boxes_stay_inside_the_image_with_randomresizedcrop_bounds(height, width):
    for index in range(200):
        top, left, h, w = crop_box(draw_train_crop(0, 0, index), height, width, 224)
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width and h > 0 and w > 0
        assert 0.75 - 0.15 <= w / h <= 4 / 3 + 0.15  # aspect ratio in RandomResizedCrop's range (+ rounding)
        if 0.75 <= width / height <= 4 / 3:  # every draw fits somewhere: area in the scale range
            assert 0.08 * height * width * 0.9 <= h * w <= height * width


def test_validation_box_is_the_centred_square_of_resize_then_centre_crop():
    assert crop_box(VALIDATION_DRAW, 375, 500, 224) == (23, 86, 328, 328)  # 375 * 0.875 = 328
    assert crop_box(VALIDATION_DRAW, 256, 256, 224) == (16, 16, 224, 224)


def test_resized_crop_output_and_flip():
    image = torch.arange(3 * 6 * 8, dtype=torch.float32).view(3, 6, 8).to(torch.uint8)
    whole = CropDraw(torch.tensor([[1.0, 0.0, 0.0, 0.0]] * CROP_ATTEMPTS, dtype=torch.float64), False)
    same = resized_crop(image[:, :6, :6], whole, 6)
    assert same.dtype == torch.uint8 and torch.equal(same, image[:, :6, :6])  # no resize: exact
    flipped = resized_crop(image[:, :6, :6], CropDraw(whole.attempts, True), 6)
    assert torch.equal(flipped, image[:, :6, :6].flip(-1))
    assert resized_crop(image, draw_train_crop(0, 0, 0), 4).shape == (3, 4, 4)


def test_normalize_uint8_matches_the_float_formula():
    pixels = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    expected = (pixels.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(normalize_uint8(pixels, mean, std), expected, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- decoders

def test_jpeg_header_sniffing():
    pixels = smooth_image(1)
    assert jpeg_frame(torch.frombuffer(bytearray(jpeg_bytes(pixels)), dtype=torch.uint8)) == (0xC0, 3)
    assert jpeg_frame(jpeg_bytes(pixels, "L")) == (0xC0, 1)
    assert jpeg_frame(jpeg_bytes(pixels, "CMYK"))[1] == 4
    assert jpeg_frame(jpeg_bytes(pixels, progressive=True))[0] == 0xC2
    assert jpeg_frame(jpeg_bytes(pixels, format="PNG")) is None and jpeg_frame(b"") is None
    as_tensor = lambda data: torch.frombuffer(bytearray(data), dtype=torch.uint8)  # noqa: E731
    assert device_decodable(as_tensor(jpeg_bytes(pixels))) and device_decodable(as_tensor(jpeg_bytes(pixels, "L")))
    for other in (jpeg_bytes(pixels, "CMYK"), jpeg_bytes(pixels, progressive=True), jpeg_bytes(pixels, format="PNG")):
        assert not device_decodable(as_tensor(other))


# Tolerance of torchvision's libjpeg-turbo decode against PIL's: both use libjpeg-turbo with the
# same defaults (islow IDCT, fancy upsampling); measured identical here. Stated bound: at most
# 2 levels (of 255) per pixel, mean at most 0.25, so a different libjpeg build still passes.
DECODE_MAX_LEVELS, DECODE_MEAN_LEVELS = 2, 0.25


@pytest.mark.parametrize("mode", ["RGB", "L", "CMYK"])
def test_torchvision_cpu_decode_matches_pil_within_tolerance(tmp_path, mode):
    path = tmp_path / "x.JPEG"
    path.write_bytes(jpeg_bytes(smooth_image(3, 64, 80), mode))
    ours = decode_cpu(read_bytes(path)).int()
    with Image.open(path) as image:
        theirs = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1).int()
    assert ours.shape == theirs.shape == (3, 64, 80)
    diff = (ours - theirs).abs()
    assert diff.max() <= DECODE_MAX_LEVELS and diff.float().mean() <= DECODE_MEAN_LEVELS


# ----------------------------------------------------------------------------- decode placements

@pytest.mark.parametrize("split", ["train", "val"])
def test_cpu_and_device_decode_paths_give_the_same_labels_and_images(tree, split):
    """Same decoder on a CPU device, so the two placements must agree exactly (tolerance 0)."""
    on_workers = ImageNet100(tree, split, image_size=SIZE, seed=3, decode="cpu")
    on_device = ImageNet100(tree, split, image_size=SIZE, seed=3, decode="gpu")
    a = all_batches(on_workers, workers=0)
    b = all_batches(on_device, workers=2)
    assert len(a) == len(b) == 10
    for x, y in zip(a, b):
        assert torch.equal(x.labels, y.labels) and torch.equal(x.images, y.images)
        assert x.images.dtype == torch.float32 and x.images.shape == (10, 3, SIZE, SIZE)


def test_device_path_ships_packed_bytes_and_worker_path_ships_uint8(tree):
    dataset = ImageNet100(tree, "train", image_size=SIZE, decode="gpu")
    host = dataset.host_collate([dataset.host_item(i) for i in range(4)])
    files = [read_bytes(path) for path, _ in dataset.folder.samples[:4]]
    assert host.decoded is None and host.encoded_slots == [0, 1, 2, 3]
    assert all(torch.equal(a, b) for a, b in zip(host.encoded_files(), files))  # one tensor, cut back exactly
    assert host.attempts.shape == (4, CROP_ATTEMPTS, 4) and len(host.flips) == 4
    dataset = ImageNet100(tree, "train", image_size=SIZE, decode="cpu")
    host = dataset.host_collate([dataset.host_item(i) for i in range(4)])
    assert host.encoded is None and host.decoded.dtype == torch.uint8 and host.decoded.shape == (4, 3, SIZE, SIZE)


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
def test_gpu_share_splits_samples_by_index_and_changes_nothing_on_one_decoder(tree, share):
    dataset = ImageNet100(tree, "train", image_size=SIZE, seed=3, decode="gpu", gpu_share=share)
    host = dataset.host_collate([dataset.host_item(i) for i in range(100)])
    assert len(host.encoded_slots) == round(100 * share) or 0 < share < 1 and 15 <= len(host.encoded_slots) <= 45
    again = dataset.host_collate([dataset.host_item(i) for i in range(100)])
    assert host.encoded_slots == again.encoded_slots  # a function of the index, not of timing
    reference = all_batches(ImageNet100(tree, "train", image_size=SIZE, seed=3, decode="cpu"))
    for x, y in zip(reference, all_batches(dataset, workers=2)):  # one decoder on a CPU: identical
        assert torch.equal(x.images, y.images) and torch.equal(x.labels, y.labels)


def test_bad_gpu_share_is_an_error(tree):
    with pytest.raises(DataError, match=r"gpu_share must be a number in \[0, 1\], got 1.5"):
        ImageNet100(tree, "train", gpu_share=1.5)


def test_batched_resampler_matches_torch_antialiased_interpolate():
    """The CUDA path's batched crop + resize (two matmuls per image size) against
    F.interpolate(antialias=True) per image: at most 1 level apart (float summation order)."""
    generator = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
              for shape in [(3, 75, 100)] * 6 + [(3, 100, 75)] * 3 + [(3, 20, 30)]]
    draws = [draw_train_crop(0, 0, i) for i in range(8)] + [VALIDATION_DRAW, draw_train_crop(0, 0, 99)]
    out = resized_crops(images, draws, 32)  # includes upscaled crops (20x30 -> 32) and flips
    assert out.shape == (10, 3, 32, 32) and out.dtype == torch.uint8
    for image, draw, got in zip(images, draws, out):
        top, left, h, w = crop_box(draw, image.shape[1], image.shape[2], 32)
        expected = F.interpolate(image[None, :, top:top + h, left:left + w].float(), size=(32, 32), mode="bilinear",
                                 align_corners=False, antialias=True)[0]
        expected = (expected.flip(-1) if draw.flip else expected).round().clamp(0, 255)
        diff = (got.float() - expected).abs()
        assert diff.max() <= 1 and diff.mean() < 0.01


def test_auto_decodes_on_the_workers_for_a_cpu_device(tree):
    dataset = ImageNet100(tree, "train", image_size=SIZE, decode="auto")
    dataset.bind_device(torch.device("cpu"))
    assert not dataset.decode_on_device


def test_images_are_the_reference_crop_of_the_file(tree):
    """An item is crop_box + antialiased resize + normalisation of the decoded file, nothing else."""
    dataset = ImageNet100(tree, "train", image_size=SIZE, seed=5)
    dataset.set_epoch(2)
    path, label = dataset.folder.samples[17]
    expected = normalize_uint8(resized_crop(decode_cpu(read_bytes(path)), draw_train_crop(5, 2, 17), SIZE)[None],
                               IMAGENET_MEAN, (0.229, 0.224, 0.225))[0]
    image, got_label = dataset[17]
    assert got_label == label and torch.equal(image, expected)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("decode, workers", [("cpu", 0), ("cpu", 2), ("gpu", 0), ("gpu", 2)])
def test_bad_files_are_replaced_and_counted_never_a_crash(bad_tree, decode, workers):
    dataset = ImageNet100(bad_tree, "train", image_size=SIZE, decode=decode)
    log = BadSampleLog()
    with pytest.warns(DataWarning, match="skipped unreadable image") as caught:
        batches = all_batches(dataset, workers=workers, bad_samples=log)
    assert len(batches) == 10  # the whole epoch
    assert sorted(s.index for s in log.samples) == [0, 1]  # truncated, not an image
    assert all(s.reason for s in log.samples) and len([w for w in caught if w.category is DataWarning]) == 2
    by_index = {}
    order = ResumableSampler(len(dataset), seed=0, batch_size=10, drop_last=True).epoch_order(0)
    for batch, chunk in zip(batches, np.array_split(order, 10)):
        for slot, index in enumerate(chunk):
            by_index[int(index)] = (batch.images[slot], int(batch.labels[slot]))
    assert [by_index[i][1] for i in range(6)] == list(range(6))  # labels kept, also for stand-ins
    for index in (0, 1):  # the stand-in: the mean colour, zero after normalisation (up to rounding)
        assert by_index[index][0].abs().max() < 0.01
    reference = ImageNet100(bad_tree, "train", image_size=SIZE, decode="cpu")
    for index in (2, 3, 4, 5):  # grey, CMYK, PNG, progressive: decoded for real, same on both paths
        image = by_index[index][0]
        assert image.abs().max() > 0.1 and torch.equal(image, reference[index][0])


def test_grey_jpeg_becomes_three_equal_channels(bad_tree):
    image, _ = ImageNet100(bad_tree, "train", image_size=SIZE, decode="cpu")[2]
    pixels = image * torch.tensor((0.229, 0.224, 0.225)).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    assert torch.allclose(pixels[0], pixels[1], atol=1e-5) and torch.allclose(pixels[1], pixels[2], atol=1e-5)


# ----------------------------------------------------------------------------- labels only

def test_labels_only_loading_reads_no_image(tmp_path):
    root = make_tree(tmp_path)
    dataset = ImageNet100(root, "train", image_size=SIZE, seed=1)
    full = all_batches(dataset, seed=4)
    for path, _ in dataset.folder.samples:  # from here on, reading any image would fail
        Path(path).unlink()
    labels_only = all_batches(dataset, seed=4, load="labels")
    assert len(labels_only) == len(full)
    for x, y in zip(full, labels_only):
        assert y.images is None and torch.equal(x.labels, y.labels)


def test_labels_only_matches_for_every_data_set():
    synthetic = SyntheticImages(num_samples=30, num_classes=7, image_size=4)
    assert torch.equal(synthetic.labels_of(range(30)), torch.tensor([synthetic[i][1] for i in range(30)]))


# ----------------------------------------------------------------------------- resume

@pytest.mark.slow  # JPEG decoding through a data loader, twice per case
@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_resume_replays_the_same_images_in_the_same_order(tree, decode):
    dataset = ImageNet100(tree, "train", image_size=SIZE, seed=2, decode=decode)
    whole = all_batches(dataset, batch_size=10, epochs=2, workers=2, seed=2)
    sampler = ResumableSampler(len(dataset), seed=2, batch_size=10, drop_last=True)
    consumed = 0
    for batch in train_batches(dataset, sampler, 2, num_workers=2):  # the loader runs ahead
        consumed += 1
        if consumed == 13:  # stop inside epoch 1, as a crash after a checkpoint would
            state = sampler.state_after(batch.epoch, batch.step_in_epoch)
            break
    resumed = ResumableSampler(len(dataset), seed=2, batch_size=10, drop_last=True)
    resumed.load_state_dict(state)
    rest = list(train_batches(dataset, resumed, 2, num_workers=2))
    assert len(rest) == len(whole) - 13
    for x, y in zip(whole[13:], rest):
        assert (x.epoch, x.step_in_epoch) == (y.epoch, y.step_in_epoch)
        assert torch.equal(x.images, y.images) and torch.equal(x.labels, y.labels)


# ----------------------------------------------------------------------------- synthetic on the device

def test_synthetic_device_batch_is_the_rolled_pool_image():
    dataset = SyntheticImages(num_samples=100, num_classes=5, image_size=6, in_chans=2, seed=3)
    pool = torch.randn((64, 2, 6, 6), generator=seeded_generator(3, "train", -1))
    images, labels = dataset.get_batch([0, 70, 99])
    for slot, index in enumerate([0, 70, 99]):
        generator = seeded_generator(3, "train", index)
        label = int(torch.randint(5, (1,), generator=generator))
        shift = int(torch.randint(36, (1,), generator=generator))
        expected = torch.roll(pool[index % 64].flatten(1), shift, dims=1).view(2, 6, 6)
        assert torch.equal(images[slot], expected) and int(labels[slot]) == label


def test_synthetic_workers_ship_three_integers_per_sample():
    dataset = SyntheticImages(num_samples=10, image_size=224)
    host = dataset.host_collate([dataset.host_item(i) for i in range(4)])
    assert host.shape == (4, 3) and host.dtype == torch.int64


# ----------------------------------------------------------------------------- prefetcher

def test_prefetcher_keeps_order_and_runs_ahead():
    finished: list[int] = []

    def finish(item):
        finished.append(item)
        return torch.tensor([item])

    out = []
    for value in DevicePrefetcher(range(20), finish, torch.device("cpu"), depth=2, overlap=True):
        out.append(int(value))
        if len(out) == 1:
            deadline = threading.Event()
            deadline.wait(0.5)
            assert len(finished) >= 2  # the next batches were finished while this one was in use
    assert out == list(range(20))


def test_on_the_cpu_the_prefetcher_finishes_inline_with_no_thread():
    finished: list[int] = []
    prefetcher = DevicePrefetcher(range(5), lambda item: finished.append(item) or item, torch.device("cpu"))
    for value in prefetcher:
        assert finished[-1] == value  # nothing finished ahead: no second thread competes with the step
    assert finished == list(range(5)) and not prefetcher._thread.is_alive()


def test_prefetcher_reraises_an_error_from_finishing():
    def finish(item):
        if item == 3:
            raise ValueError("bad batch 3")
        return item

    seen = []
    with pytest.raises(ValueError, match="bad batch 3"):
        for value in DevicePrefetcher(range(10), finish, torch.device("cpu"), overlap=True):
            seen.append(value)
    assert seen == [0, 1, 2]


@pytest.mark.parametrize("finishers", [1, 3])
def test_prefetcher_stops_its_threads_when_the_consumer_stops_early(finishers):
    closed = threading.Event()

    def endless():
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    prefetcher = DevicePrefetcher(endless(), lambda x: x, torch.device("cpu"), overlap=True, finishers=finishers)
    for value in prefetcher:
        if value == 5:
            break
    assert closed.wait(5)
    assert not any(t.is_alive() for t in (prefetcher._thread, *prefetcher._finishers))


@pytest.mark.parametrize("finishers", [2, 3])
def test_several_finishers_hand_out_items_in_source_order_however_long_each_takes(finishers):
    import random
    import time
    delays = random.Random(finishers).choices([0.0, 0.002, 0.02], k=40)

    def finish(item):
        time.sleep(delays[item])  # later items often finish first
        return torch.tensor([item])

    out = [int(v) for v in DevicePrefetcher(range(40), finish, torch.device("cpu"), overlap=True,
                                            finishers=finishers)]
    assert out == list(range(40))


def test_several_finishers_work_at_once():
    import time
    running, most = 0, 0
    lock = threading.Lock()

    def finish(item):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)  # releases the interpreter lock, as the host half of nvJPEG does
        with lock:
            running -= 1
        return item

    assert list(DevicePrefetcher(range(12), finish, torch.device("cpu"), depth=4, overlap=True,
                                 finishers=3)) == list(range(12))
    assert most >= 2


@pytest.mark.parametrize("failing", ["finish", "source"])
def test_with_several_finishers_an_error_reraises_at_its_place(failing):
    def source():
        for n in range(10):
            if failing == "source" and n == 5:
                raise ValueError("source broke at 5")
            yield n

    def finish(item):
        if failing == "finish" and item == 5:
            raise ValueError("finish broke at 5")
        return item

    seen = []
    with pytest.raises(ValueError, match="broke at 5"):
        for value in DevicePrefetcher(source(), finish, torch.device("cpu"), overlap=True, finishers=2):
            seen.append(value)
    assert seen == [0, 1, 2, 3, 4]


def test_a_prefetcher_needs_at_least_one_finisher():
    with pytest.raises(ValueError, match="finishers must be >= 1"):
        DevicePrefetcher(range(3), lambda x: x, torch.device("cpu"), finishers=0)


# ----------------------------------------------------------------------------- CUDA

# nvJPEG and libjpeg-turbo differ in IDCT and chroma upsampling; after the antialiased resize the
# difference stays small on average. Stated tolerance: mean |diff| <= 1.5 levels of 255 and
# 99th percentile <= 8 levels, labels identical.
CUDA_MEAN_LEVELS, CUDA_P99_LEVELS = 1.5, 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_decode_matches_cpu_decode_within_tolerance(tmp_path):
    root = make_tree(tmp_path, per_class=2, classes=10)
    device = torch.device("cuda")
    for split in ("train", "val"):
        cpu = ImageNet100(root, split, image_size=64, seed=1, decode="cpu")
        gpu = ImageNet100(root, split, image_size=64, seed=1, decode="gpu")
        with warnings.catch_warnings():
            warnings.simplefilter("error", DataWarning)  # no file may fall back as unreadable
            a = all_batches(cpu, device=device, workers=2)
            b = all_batches(gpu, device=device, workers=2)
        std = torch.tensor((0.229, 0.224, 0.225), device=device).view(1, 3, 1, 1) * 255
        for x, y in zip(a, b):
            assert torch.equal(x.labels, y.labels)
            levels = ((x.images - y.images) * std).abs().flatten()
            assert levels.mean() <= CUDA_MEAN_LEVELS and levels.quantile(0.99) <= CUDA_P99_LEVELS


# ----------------------------------------------------------------------------- config

def test_a_decode_share_outside_zero_to_one_is_refused_before_any_work(make_config, tree):
    from synapse.config import ConfigError, validate

    with pytest.raises(ConfigError, match=r"data.gpu_decode_share: must be in \[0, 1\], got 1.5"):
        validate(make_config("data=imagenet100", f"data.root={tree}", "data.gpu_decode_share=1.5"))


def test_an_unknown_decoder_is_refused_while_composing_naming_the_valid_ones(make_config, tree):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="Error merging override data.decode=nvjpeg") as error:
        make_config("data=imagenet100", f"data.root={tree}", "data.decode=nvjpeg")
    assert "Invalid value 'nvjpeg', expected one of [auto, cpu, gpu]" in str(error.value.__cause__)


def test_a_rank_config_gets_the_resolved_settings(make_config, tree):
    from synapse.config import typed_config
    from synapse.engine import loader_workers, with_host_data_path

    cfg = typed_config(make_config("data=imagenet100", f"data.root={tree}"))
    assert cfg.data.num_workers == "auto" and cfg.data.decode == "auto"  # the data group's defaults
    with pytest.raises(ValueError, match="not resolved for this host"):
        loader_workers(cfg.data)
    resolved, path = with_host_data_path(cfg, torch.device("cpu"), local_ranks=1, local_readers=1)
    assert resolved.data.decode == "cpu" and loader_workers(resolved.data) == path.workers >= 0
    kept, _ = with_host_data_path(typed_config(make_config("data=imagenet100", f"data.root={tree}",
                                                           "data.num_workers=3", "data.decode=gpu")),
                                  torch.device("cpu"), local_ranks=1, local_readers=1)
    assert (kept.data.num_workers, kept.data.decode) == (3, "gpu")


def test_a_worker_count_that_is_neither_a_number_nor_auto_is_refused_naming_both(make_config, tree):
    from synapse.config import ConfigError, validate

    with pytest.raises(ConfigError, match="data.num_workers: 'many' is neither a count nor 'auto'"):
        validate(make_config("data=imagenet100", f"data.root={tree}", "data.num_workers=many"))


def test_decode_settings_reach_the_data_set(make_config, tree):
    from synapse.data import build_datasets

    cfg = make_config("data=imagenet100", f"data.root={tree}", "data.decode=gpu", "data.gpu_decode_share=0.25")
    train, val = build_datasets(cfg.data, cfg.seed)
    assert (train.decode, train.gpu_share, val.decode) == ("gpu", 0.25, "gpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetcher_hands_out_finished_batches_only():
    """Work queued on the side stream must be complete, as seen from the consumer's stream."""
    device = torch.device("cuda")
    weights = torch.randn(2048, 2048, device=device)

    def finish(i):
        x = torch.full((2048, 2048), float(i), device=device)
        for _ in range(20):  # keep the side stream busy so a missing wait would show
            x = (x @ weights) * 0 + i
        return x

    for i, x in enumerate(DevicePrefetcher(range(8), finish, device)):
        assert float(x.mean()) == float(i)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_synthetic_batch_equals_the_cpu_batch():
    dataset = SyntheticImages(num_samples=300, image_size=32)
    host = dataset.host_collate([dataset.host_item(i) for i in range(0, 300, 7)])
    on_gpu = dataset.device_batch(host, torch.device("cuda"))
    on_cpu = dataset.device_batch(host, torch.device("cpu"))
    assert torch.equal(on_gpu[0].cpu(), on_cpu[0]) and torch.equal(on_gpu[1].cpu(), on_cpu[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batched_resampler_matches_the_cpu_kernel():
    generator = torch.Generator().manual_seed(1)
    images = [torch.randint(0, 256, (3, 375, 500), dtype=torch.uint8, generator=generator) for _ in range(6)]
    draws = [draw_train_crop(1, 0, i) for i in range(5)] + [VALIDATION_DRAW]
    on_gpu = resized_crops([image.cuda() for image in images], draws, 224).cpu()
    on_cpu = torch.stack([resized_crop(image, draw, 224) for image, draw in zip(images, draws)])
    diff = (on_gpu.int() - on_cpu.int()).abs()
    # The uint8 CPU kernel rounds its weights to fixed point, the batched resampler works in float32:
    # on the CPU they differ by one level on ~17% of pixels (mean 0.168, max 1; the test below). The
    # first H200 run failed an earlier bound of mean < 0.1 that the CPU does not meet either.
    assert diff.max() <= 2 and diff.float().mean() < 0.25


def test_batched_resampler_matches_the_uint8_kernel_within_one_level():
    generator = torch.Generator().manual_seed(1)
    images = [torch.randint(0, 256, (3, 375, 500), dtype=torch.uint8, generator=generator) for _ in range(6)]
    draws = [draw_train_crop(1, 0, i) for i in range(5)] + [VALIDATION_DRAW]
    batched = resized_crops(images, draws, 224)
    one_by_one = torch.stack([resized_crop(image, draw, 224) for image, draw in zip(images, draws)])
    diff = (batched.int() - one_by_one.int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 0.25


def test_eval_labels_only_reads_no_image(tmp_path):
    from synapse.engine import eval_batches

    root = make_tree(tmp_path)
    val = ImageNet100(root, "val", image_size=SIZE)
    full = list(eval_batches(val, 30, num_workers=2))
    for path, _ in val.folder.samples:
        Path(path).unlink()
    labels_only = list(eval_batches(val, 30, load="labels"))
    assert [len(y) for _, y in full] == [30, 30, 30, 10]
    assert all(x is None and torch.equal(y, y_full) for (x, y), (_, y_full) in zip(labels_only, full))
