"""Links inside ImageNet100 class folders (issue #33, item 10).

A link in ``train/<synset>/`` to a folder above it (``loop -> ..``) made torchvision's scan, which
follows every link without a cycle check, repeat the whole split under that one class: 8,200
samples from 200, 8,002 of them labelled class 0, silently. Links to folders inside a class
folder are now never followed, and each one skipped is named; the usual ways of building an
ImageNet subset with links (a linked class folder, linked image files) keep working. Real
folders, real links, real image files.
"""
from __future__ import annotations

import collections
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

from synapse.data import DataLayoutWarning, ImageNet100, imagenet100_synsets

SYNSETS = imagenet100_synsets()


def write_image(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG")


def imagenet_tree(root: Path, per_class: int = 2) -> Path:
    """Both splits, ``per_class`` JPEGs in every one of the 100 class folders: 200 train samples."""
    for split in ("train", "val"):
        for n, synset in enumerate(SYNSETS):
            for k in range(per_class):
                write_image(root / split / synset / f"{synset}_{k}.JPEG", seed=n * 10 + k)
    return root


def scan(root: Path, split: str = "train") -> tuple[ImageNet100, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = ImageNet100(root, split, image_size=8)
    return dataset, [w for w in caught if issubclass(w.category, DataLayoutWarning)]


@pytest.fixture
def tree(tmp_path) -> Path:
    return imagenet_tree(tmp_path / "imagenet")


def test_a_link_loop_inside_a_class_folder_is_skipped_and_named(tree):
    loop = tree / "train" / SYNSETS[0] / "loop"
    loop.symlink_to("..")  # the report's tree: the link points at train/ itself
    dataset, said = scan(tree)
    assert len(dataset) == 200  # was 8,200
    assert collections.Counter(dataset.targets) == {label: 2 for label in range(100)}  # was 8,002 for class 0
    assert dataset.skipped_links == [str(loop)]
    (warning,) = said
    assert str(warning.message) == (
        f"ImageNet100 train/: skipped 1 link(s) to folders inside class folders, not followed so that no image is "
        f"counted twice or under another class: {loop} -> '..'. If the images there belong to that class, copy "
        f"them (or link each file) into the class folder itself")
    assert scan(tree, "val")[1] == []  # the other split has no link: nothing to say


def test_links_to_folders_elsewhere_are_skipped_too_and_all_named(tree, tmp_path):
    outside = tmp_path / "more_images"
    write_image(outside / "extra.JPEG", seed=99)
    links = [tree / "train" / SYNSETS[3] / "extra", tree / "train" / SYNSETS[7] / "deeper" / "again"]
    links[0].symlink_to(outside)
    links[1].parent.mkdir()
    links[1].symlink_to(tree / "train" / SYNSETS[7])  # a loop one folder down
    dataset, said = scan(tree)
    assert len(dataset) == 200 and not any("extra.JPEG" in path for path, _ in dataset.folder.samples)
    assert dataset.skipped_links == [str(links[0]), str(links[1])]
    (warning,) = said
    message = str(warning.message)
    assert "skipped 2 link(s)" in message
    assert f"{links[0]} -> {str(outside)!r}; {links[1]} -> {str(tree / 'train' / SYNSETS[7])!r}" in message


def test_the_usual_linked_subsets_and_real_subfolders_still_load_in_torchvisions_order(tree, tmp_path):
    # A class folder that is itself a link, image files that are links, and images in a real
    # subfolder: all kept, in exactly the order torchvision's own scan gives (sample indices,
    # and so crops and the sampler's order, stay what earlier runs used).
    full = tmp_path / "full_imagenet" / SYNSETS[1]
    full.parent.mkdir()
    os.rename(tree / "train" / SYNSETS[1], full)
    (tree / "train" / SYNSETS[1]).symlink_to(full)
    write_image(tmp_path / "pool" / "shared.JPEG", seed=7)
    (tree / "train" / SYNSETS[2] / "linked.JPEG").symlink_to(tmp_path / "pool" / "shared.JPEG")
    write_image(tree / "train" / SYNSETS[4] / "sub" / "nested.JPEG", seed=8)
    (tree / "train" / SYNSETS[5] / "notes.txt").write_text("not an image")
    dataset, said = scan(tree)
    assert said == [] and dataset.skipped_links == []
    assert len(dataset) == 202
    expected = make_dataset(str(tree / "train"), {s: i for i, s in enumerate(SYNSETS)}, extensions=IMG_EXTENSIONS)
    assert dataset.folder.samples == expected
