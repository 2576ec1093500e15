"""ImageNet100: the standard ImageNet folder tree, restricted to 100 synsets.

Expected layout (ILSVRC2012 with val images sorted into synset folders)::

    <root>/train/<synset>/*.JPEG
    <root>/val/<synset>/*.JPEG

Other synsets may be present (a full 1000-class tree works) and are ignored: only the
100 synsets listed in the shipped ``imagenet100.txt`` are scanned. Class index = position
of the synset in the *sorted* list, identical for train and val.

A class folder may itself be a link (a subset linked from a full ImageNet tree) and may hold
links to image files; links to *folders* inside it are never followed, and each one skipped is
named in a ``DataLayoutWarning``: a link back up (``train/<synset>/loop -> ..``) would otherwise
repeat the whole split under that one class, 40 times over (the OS's limit of nested links).
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path

import torch
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from synapse.data.base import (
    DataError,
    DataLayoutWarning,
    DatasetInfo,
    EpochDataset,
    require_positive_int,
    require_split,
)
from synapse.data.crops import VALIDATION_DRAW, draw_train_crop
from synapse.data.image_batches import (
    HostSample,
    ImageBatch,
    collate_samples,
    finish_on_device,
    load_sample,
    on_device_share,
)
from synapse.data.jpeg import device_decoding_available

IMAGENET100_NUM_CLASSES = 100
IMAGENET100_DEFAULT_IMAGE_SIZE = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_SHOWN = 5  # how many missing names an error message lists
_LAYOUT_HINT = ("expected <root>/train/<synset>/*.JPEG and <root>/val/<synset>/*.JPEG (the "
                "standard ImageNet folder layout); pass the folder holding train/ and val/ "
                "as root (data.root in the config)")


def imagenet100_info(image_size: int = IMAGENET100_DEFAULT_IMAGE_SIZE) -> DatasetInfo:
    require_positive_int("image_size", image_size)
    return DatasetInfo(IMAGENET100_NUM_CLASSES, 3, image_size)


@lru_cache(maxsize=1)
def imagenet100_synsets() -> tuple[str, ...]:
    """The 100 synset ids, sorted; read from the package data file ``imagenet100.txt``."""
    text = resources.files("synapse.data").joinpath("imagenet100.txt").read_text("utf-8")
    synsets = [line.strip() for line in text.splitlines() if line.strip()]
    malformed = [s for s in synsets if not (len(s) == 9 and s[0] == "n" and s[1:].isdigit())]
    if malformed or len(set(synsets)) != IMAGENET100_NUM_CLASSES:
        raise DataError(f"package file imagenet100.txt is corrupt: {len(set(synsets))} unique "
                        f"ids (need {IMAGENET100_NUM_CLASSES}), malformed: {malformed[:_SHOWN]}")
    return tuple(sorted(synsets))


def _first_few(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (", ..." if len(names) > _SHOWN else "")


def _has_image(directory: Path) -> bool:
    with os.scandir(directory) as entries:  # stops at the first image: cheap on big folders
        return any(e.is_file() and e.name.lower().endswith(IMG_EXTENSIONS) for e in entries)


def _require_root(root: str | os.PathLike[str] | None) -> Path:
    if root is None or str(root).strip() == "":
        raise DataError(f"ImageNet100 root is not set; {_LAYOUT_HINT}")
    path = Path(root).expanduser()
    if not path.exists():
        raise DataError(f"ImageNet100 root {str(path)!r} does not exist; {_LAYOUT_HINT}")
    if not path.is_dir():
        raise DataError(f"ImageNet100 root {str(path)!r} is a file, not a folder; {_LAYOUT_HINT}")
    return path


def _require_split_dirs(root: Path) -> None:
    absent = [split for split in ("train", "val") if not (root / split).is_dir()]
    if absent:
        found = sorted(p.name for p in root.iterdir())
        hint = _LAYOUT_HINT
        if set(found) & set(imagenet100_synsets()):  # a common slip: data.root=/imagenet/train
            hint = (f"it holds synset folders, so it looks like a split folder itself: use its parent "
                    f"{str(root.parent)!r} as data.root; " + hint)
        raise DataError(f"ImageNet100 root {str(root)!r} has no {'/ or '.join(absent)}/ folder "
                        f"(it holds: {_first_few(found) or 'nothing'}); {hint}")


def _check_synset_dirs(split_dir: Path, synsets: Sequence[str]) -> None:
    split = split_dir.name
    missing = [s for s in synsets if not (split_dir / s).is_dir()]
    if missing:
        hint = _LAYOUT_HINT
        if _has_image(split_dir):
            hint = (f"{split}/ holds image files directly: sort them into one folder per "
                    "synset (e.g. with the usual valprep.sh script for ImageNet val); " + hint)
        raise DataError(
            f"ImageNet100 {split}/ folder {str(split_dir)!r} lacks {len(missing)} of "
            f"{len(synsets)} synset folders (first missing: {_first_few(missing)}); {hint}"
        )
    empty = [s for s in synsets if not _has_image(split_dir / s)]
    if empty:
        raise DataError(
            f"ImageNet100 {split}/ has {len(empty)} synset folders without any image file "
            f"(extensions {IMG_EXTENSIONS}): {_first_few(empty)}; copy the images into them"
        )


def check_imagenet100_root(root: str | os.PathLike[str] | None) -> Path:
    """Validate the whole folder layout without reading any image; returns the root.

    Raises ``DataError`` naming what is missing and how to fix it. Cheap enough for the
    config layer to call before any process starts (one directory listing per synset).
    """
    path = _require_root(root)
    _require_split_dirs(path)
    synsets = imagenet100_synsets()
    for split in ("train", "val"):
        _check_synset_dirs(path / split, synsets)
    return path


class _AllowListImageFolder(ImageFolder):
    """ImageFolder that only sees the given class folders (never scans the others) and follows
    no link to a folder inside them (``skipped_links`` lists those it passed over)."""

    def __init__(self, root: Path, classes: Sequence[str]):
        self._allowed = list(classes)
        self.skipped_links: list[str] = []
        super().__init__(str(root))

    def find_classes(self, directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
        return list(self._allowed), {name: i for i, name in enumerate(self._allowed)}

    def make_dataset(self, directory: str | os.PathLike[str], class_to_idx: dict[str, int],
                     extensions: tuple[str, ...] | None = None, is_valid_file: Callable[[str], bool] | None = None,
                     allow_empty: bool = False) -> list[tuple[str, int]]:
        """torchvision's scan (same files, same order) without following links to folders.

        torchvision walks with ``followlinks=True``, which has no cycle check: a link inside a
        class folder to a folder above it turned 200 images into 8,200, all but 198 under that
        class. The class folder itself is still entered when it is a link (``os.walk`` lists its
        top), and links to image files are kept: both are how ImageNet subsets are usually built.
        """
        def valid(path: str) -> bool:
            return is_valid_file(path) if is_valid_file is not None else has_file_allowed_extension(
                path, extensions or IMG_EXTENSIONS)

        samples: list[tuple[str, int]] = []
        for name in sorted(class_to_idx):
            for folder, subfolders, files in sorted(os.walk(os.path.join(directory, name), followlinks=False)):
                self.skipped_links += [os.path.join(folder, sub) for sub in sorted(subfolders)
                                       if os.path.islink(os.path.join(folder, sub))]
                samples += [(os.path.join(folder, file), class_to_idx[name]) for file in sorted(files)
                            if valid(os.path.join(folder, file))]
        return samples


def _warn_skipped_links(split: str, links: Sequence[str]) -> None:
    shown = "; ".join(f"{link} -> {os.readlink(link)!r}" for link in links[:_SHOWN])
    more = f" and {len(links) - _SHOWN} more" if len(links) > _SHOWN else ""
    warnings.warn(f"ImageNet100 {split}/: skipped {len(links)} link(s) to folders inside class folders, not followed "
                  f"so that no image is counted twice or under another class: {shown}{more}. If the images there "
                  f"belong to that class, copy them (or link each file) into the class folder itself",
                  DataLayoutWarning, stacklevel=3)


DECODE_CHOICES = ("cpu", "gpu", "auto")


class ImageNet100(EpochDataset):
    """ImageNet100 split: RandomResizedCrop + flip (train) or resize + centre crop (val).

    The train crop of sample ``i`` is drawn from a generator seeded by (seed, epoch, i)
    (``crops.draw_train_crop``), never from a global RNG: identical for any ``num_workers``,
    decode path and after a resume.

    ``decode``: where JPEGs are decoded when loading for a device (``bind_device``):
    ``cpu`` in the loader workers; ``gpu`` in the training process on its device (nvJPEG on
    CUDA; on a CPU device the same path with the CPU decoder, which is what tests run);
    ``auto``: ``gpu`` when the device is CUDA and torchvision can decode there, else ``cpu``. (A run
    never passes ``auto`` here: its ``data.decode=auto`` is resolved for the host first, weighing the
    loader workers it can afford against the GPU, ``synapse.data.host_path``.)
    ``gpu_share``: with ``gpu``, the fraction of samples whose JPEG the device decodes; the
    workers decode the rest at the same time (a fixed choice per sample index, so it is the
    same in every run). 1.0 when the device decoder alone keeps up.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        split: str = "train",
        image_size: int = IMAGENET100_DEFAULT_IMAGE_SIZE,
        seed: int = 0,
        decode: str = "cpu",
        gpu_share: float = 1.0,
    ) -> None:
        self.split = require_split(split)
        self.info = imagenet100_info(image_size)
        self.seed = require_positive_int("seed", seed, minimum=0)
        if decode not in DECODE_CHOICES:
            raise DataError(f"decode must be one of {list(DECODE_CHOICES)}, got {decode!r} "
                            "(data.decode in the config)")
        self.decode = decode
        if isinstance(gpu_share, bool) or not isinstance(gpu_share, (int, float)) or not 0 <= gpu_share <= 1:
            raise DataError(f"gpu_share must be a number in [0, 1], got {gpu_share!r} (data.gpu_decode_share)")
        self.gpu_share = float(gpu_share)
        self.decode_on_device = decode == "gpu"
        self.root = check_imagenet100_root(root)  # validate before scanning any folder
        self.classes = imagenet100_synsets()
        self.folder = _AllowListImageFolder(self.root / split, self.classes)
        if self.folder.skipped_links:
            _warn_skipped_links(split, self.folder.skipped_links)
        self.epoch = 0

    @property
    def targets(self) -> list[int]:
        return self.folder.targets

    @property
    def skipped_links(self) -> list[str]:
        """Links to folders inside class folders that the scan did not follow (also said in a warning)."""
        return list(self.folder.skipped_links)

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self.get_batch([index])
        return images[0], int(labels[0])

    def bind_device(self, device: torch.device) -> None:
        if self.decode == "auto":
            self.decode_on_device = device_decoding_available(device)
        elif self.decode == "gpu" and device.type == "cuda" and not device_decoding_available(device):
            raise DataError("data.decode=gpu, but this torchvision cannot decode JPEGs on CUDA (no nvJPEG); "
                            "use data.decode=cpu or data.decode=auto")

    @property
    def device_finishers(self) -> int:
        """Two when the device decodes: nvJPEG's host half (entropy decoding, about 25 ms of a
        256-image batch on an H200 host) lets go of the interpreter lock, so a second finisher
        overlaps it. Loader alone on one H200: 8.7k -> 12.8k img/s with 4 workers; four ranks
        with 2 workers each, 17.4k -> 22.7k; training fed by it: a tie
        (experiments/results/h200/data_path_2026-12-04)."""
        return 2 if self.decode_on_device else 1

    def host_item(self, index: int) -> HostSample:
        index = self._normalize_index(index)
        path, label = self.folder.samples[index]
        draw = draw_train_crop(self.seed, self.epoch, index) if self.split == "train" else VALIDATION_DRAW
        for_device = self.decode_on_device and on_device_share(index, self.gpu_share)
        return load_sample(index, path, label, draw, self.info.image_size, IMAGENET_MEAN, for_device)

    def host_collate(self, items: list[HostSample]) -> ImageBatch:
        return collate_samples(items)

    def device_batch(self, host_batch: ImageBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return finish_on_device(host_batch, device, self.info.image_size, IMAGENET_MEAN, IMAGENET_STD)

    def labels_of(self, indices: Sequence[int]) -> torch.Tensor:
        targets = self.folder.targets
        return torch.tensor([targets[self._normalize_index(i)] for i in indices], dtype=torch.int64)
