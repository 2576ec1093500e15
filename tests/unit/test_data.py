"""Tests of synapse.data: seeding, resumable sampling, digits, ImageNet100 layout, synthetic
data and the registry."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from synapse.data import (
    BatchIndexSampler,
    DataError,
    DatasetInfo,
    DigitsDataset,
    ImageNet100,
    IndexBatch,
    ResumableSampler,
    SyntheticImages,
    build_dataset,
    check_imagenet100_root,
    dataset_info,
    dataset_names,
    derive_seed,
    digits_split_indices,
    epoch_batches,
    imagenet100_synsets,
    iterate_batches,
    seeded_generator,
    translate,
)

SHARED_SYNSETS = Path(__file__).resolve().parents[1] / "data" / "imagenet100.txt"
PACKAGE_SYNSETS = Path(__file__).resolve().parents[2] / "synapse" / "data" / "imagenet100.txt"
# The digits val split as first produced (see test_digits_split_is_pinned).
PINNED_VAL_INDEX_SUM = 332476
PINNED_FIRST_VAL_INDICES = [7, 9, 10, 15, 19]


# ----------------------------------------------------------------------------- seeding

def test_derive_seed_is_deterministic_and_in_range():
    seed = derive_seed(7, 3, 11)
    assert seed == derive_seed(7, 3, 11)
    assert 0 <= seed < 2**63


def test_derive_seed_depends_on_every_part_order_and_type():
    seeds = {derive_seed(7, 3), derive_seed(3, 7), derive_seed(7, 4), derive_seed(8, 3),
             derive_seed(7, 3, 0), derive_seed("7", 3), derive_seed(7)}
    assert len(seeds) == 7


@pytest.mark.parametrize("bad", [(), (True,), (1.5,), (None,)])
def test_derive_seed_rejects_bad_parts(bad):
    with pytest.raises((TypeError, ValueError)):
        derive_seed(*bad)


def test_seeded_generator_repeats_its_stream():
    first = torch.rand(5, generator=seeded_generator(1, 2))
    assert torch.equal(first, torch.rand(5, generator=seeded_generator(1, 2)))
    assert not torch.equal(first, torch.rand(5, generator=seeded_generator(1, 3)))


# ----------------------------------------------------------------------------- sampler

def all_batches(sampler: ResumableSampler, num_epochs: int) -> list[IndexBatch]:
    return list(iterate_batches(sampler, num_epochs=num_epochs))


def test_sampler_same_seed_gives_same_batches():
    make = lambda: ResumableSampler(50, seed=3, batch_size=8)  # noqa: E731
    assert all_batches(make(), 3) == all_batches(make(), 3)


def test_sampler_epochs_are_different_permutations_of_all_indices():
    sampler = ResumableSampler(100, seed=3)
    orders = [sampler.epoch_order(epoch) for epoch in range(3)]
    for order in orders:
        assert sorted(order) == list(range(100))
    assert orders[0] != orders[1] != orders[2] != orders[0]


def test_sampler_seed_changes_the_order():
    assert ResumableSampler(100, seed=1).epoch_order(0) != ResumableSampler(100, seed=2).epoch_order(0)


def test_sampler_without_shuffle_is_sequential():
    sampler = ResumableSampler(10, seed=3, shuffle=False, batch_size=4)
    batches = all_batches(sampler, 2)
    assert [b.indices for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 2


def test_iterate_batches_numbers_epochs_and_steps_and_keeps_short_last_batch():
    batches = all_batches(ResumableSampler(10, seed=0, batch_size=4), 2)
    assert [(b.epoch, b.step_in_epoch, len(b.indices)) for b in batches] == [
        (0, 0, 4), (0, 1, 4), (0, 2, 2), (1, 0, 4), (1, 1, 4), (1, 2, 2)]


def test_drop_last_hands_out_only_full_batches():
    sampler = ResumableSampler(10, seed=0, batch_size=4, drop_last=True)
    assert sampler.epoch_length == 8 and sampler.steps_per_epoch == 2
    batches = all_batches(sampler, 3)
    assert [len(b.indices) for b in batches] == [4] * 6
    epoch0 = [i for b in batches if b.epoch == 0 for i in b.indices]
    assert len(set(epoch0)) == 8 and epoch0 == sampler.epoch_order(0)


def test_drop_last_with_too_few_samples_is_an_error():
    with pytest.raises(DataError, match="num_samples=3 < batch_size=4"):
        ResumableSampler(3, seed=0, batch_size=4, drop_last=True)


@pytest.mark.parametrize("kwargs", [{"num_samples": 0}, {"seed": -1}, {"batch_size": 0},
                                    {"num_samples": 2.5}, {"seed": True}])
def test_sampler_rejects_bad_arguments(kwargs):
    arguments = {"num_samples": 10, "seed": 0, **kwargs}
    with pytest.raises(DataError, match=next(iter(kwargs))):
        ResumableSampler(**arguments)


@pytest.mark.parametrize("consumed", [0, 1, 3, 4, 5, 9])
def test_exact_resume_from_state_after_a_consumed_batch(consumed):
    # 30 samples, batch 7 -> 5 batches per epoch (the last one short); 2 epochs = 10 batches
    reference = all_batches(ResumableSampler(30, seed=11, batch_size=7), 2)
    first = ResumableSampler(30, seed=11, batch_size=7)
    taken = list(itertools.islice(iterate_batches(first, 2), consumed))
    assert taken == reference[:consumed]
    resumed = ResumableSampler(30, seed=11, batch_size=7)
    if consumed:
        last = taken[-1]
        resumed.load_state_dict(first.state_after(last.epoch, last.step_in_epoch))
    assert all_batches(resumed, 2) == reference[consumed:]


def test_exact_resume_from_live_state_when_nothing_was_prefetched():
    reference = all_batches(ResumableSampler(20, seed=5, batch_size=3), 1)
    first = ResumableSampler(20, seed=5, batch_size=3)
    taken = list(itertools.islice(iterate_batches(first), 4))
    state = first.state_dict()
    assert state == {"epoch": 0, "position": 12, "seed": 5}
    resumed = ResumableSampler(20, seed=5, batch_size=3)
    resumed.load_state_dict(state)
    assert taken + all_batches(resumed, 1) == reference


def test_finished_epoch_rolls_over_to_the_next():
    sampler = ResumableSampler(6, seed=0, batch_size=3)
    state = sampler.state_after(epoch=2, step_in_epoch=1)  # last batch of epoch 2
    assert state == {"epoch": 2, "position": 6, "seed": 0}
    sampler.load_state_dict(state)
    assert sampler.upcoming() == (3, 0) and len(sampler) == 6
    assert [b.epoch for b in all_batches(sampler, 4)] == [3, 3]


def test_sampler_len_counts_what_the_next_iteration_yields():
    sampler = ResumableSampler(10, seed=0, batch_size=4)
    sampler.load_state_dict({"epoch": 1, "position": 4, "seed": 0})
    assert len(sampler) == 6 and len(list(sampler)) == 6
    assert len(BatchIndexSampler(sampler)) == 3  # a fresh epoch again: 4 + 4 + 2


def test_set_epoch_restarts_that_epoch():
    sampler = ResumableSampler(10, seed=0)
    next(iter(sampler))
    sampler.set_epoch(4)
    assert sampler.state_dict() == {"epoch": 4, "position": 0, "seed": 0}
    assert list(sampler) == sampler.epoch_order(4)


def test_changing_state_invalidates_a_live_iterator():
    sampler = ResumableSampler(10, seed=0)
    iterator = iter(sampler)
    next(iterator)
    sampler.load_state_dict({"epoch": 0, "position": 0, "seed": 0})
    with pytest.raises(RuntimeError, match="while this iterator was live"):
        next(iterator)


def test_a_newer_iteration_retires_the_older_one():
    sampler = ResumableSampler(10, seed=0)
    older = iter(sampler)
    first = next(older)
    newer = iter(sampler)
    assert next(newer) == sampler.epoch_order(0)[1]  # continues from the shared position
    with pytest.raises(RuntimeError, match="newer iteration"):
        next(older)
    assert first == sampler.epoch_order(0)[0]


@pytest.mark.parametrize("state, message", [
    ({"epoch": 0, "position": 0, "seed": 9}, "seed=9 but this sampler has seed=1"),
    ({"epoch": 0, "position": 0}, r"lacks keys \['seed'\]"),
    ({"epoch": 0, "position": 11, "seed": 1}, "exceeds the epoch length 10"),
    ({"epoch": -1, "position": 0, "seed": 1}, "epoch"),
])
def test_load_state_dict_rejects_foreign_states(state, message):
    with pytest.raises(DataError, match=message):
        ResumableSampler(10, seed=1, batch_size=4).load_state_dict(state)


def test_batches_refuse_a_position_between_batch_boundaries():
    sampler = ResumableSampler(10, seed=0, batch_size=4)
    sampler.load_state_dict({"epoch": 0, "position": 3, "seed": 0})
    with pytest.raises(DataError, match="position 3 is not a multiple of batch_size 4"):
        next(epoch_batches(sampler))


def test_state_after_rejects_a_step_outside_the_epoch():
    with pytest.raises(DataError, match="step_in_epoch=3"):
        ResumableSampler(10, seed=0, batch_size=4).state_after(0, 3)


def test_num_epochs_zero_yields_nothing():
    assert all_batches(ResumableSampler(10, seed=0), 0) == []


# ----------------------------------------------------------------------------- DataLoader

def loader_batches(dataset, sampler: ResumableSampler, num_workers: int):
    """The documented training-loop pattern: one DataLoader iteration per epoch."""
    batches = BatchIndexSampler(sampler)
    seen = []
    while batches.upcoming()[0] < 2:
        epoch, first_step = batches.upcoming()
        dataset.set_epoch(epoch)
        loader = DataLoader(dataset, batch_sampler=batches, num_workers=num_workers)
        for i, (images, labels) in enumerate(loader):
            seen.append((epoch, first_step + i, images, labels))
    return seen


@pytest.mark.slow  # data loader worker processes
def test_dataloader_batches_do_not_depend_on_num_workers():
    dataset = DigitsDataset("train", image_size=16, augment=True, seed=3)
    make = lambda: ResumableSampler(len(dataset), seed=1, batch_size=400)  # noqa: E731
    serial = loader_batches(dataset, make(), num_workers=0)
    parallel = loader_batches(dataset, make(), num_workers=2)
    reference = all_batches(make(), 2)
    assert [(e, s) for e, s, _, _ in serial] == [(b.epoch, b.step_in_epoch) for b in reference]
    for (_, _, x0, y0), (_, _, x1, y1), ref in zip(serial, parallel, reference, strict=True):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
        expected_x, expected_y = dataset.get_batch(ref.indices, epoch=ref.epoch)
        assert torch.equal(x0, expected_x) and torch.equal(y0, expected_y)


def test_prefetching_loader_runs_ahead_but_state_after_resumes_exactly():
    dataset = SyntheticImages(num_samples=40, num_classes=3, image_size=4, in_chans=1)
    sampler = ResumableSampler(40, seed=2, batch_size=5)
    loader = DataLoader(dataset, batch_sampler=BatchIndexSampler(sampler), num_workers=2)
    iterator = iter(loader)
    consumed = [next(iterator) for _ in range(2)]
    assert sampler.state_dict()["position"] > 10  # the loader prefetched more than it gave
    resumed = ResumableSampler(40, seed=2, batch_size=5)
    resumed.load_state_dict(sampler.state_after(epoch=0, step_in_epoch=1))
    rest = [dataset.get_batch(b.indices) for b in iterate_batches(resumed, 1)]
    whole = [dataset.get_batch(b.indices) for b in all_batches(ResumableSampler(40, seed=2, batch_size=5), 1)]
    for (x, y), (x_ref, y_ref) in zip(consumed + rest, whole, strict=True):
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    del iterator


# ----------------------------------------------------------------------------- digits

def test_digits_split_is_a_stratified_partition_of_all_images():
    from sklearn.datasets import load_digits
    labels = load_digits().target
    train, val = digits_split_indices("train"), digits_split_indices("val")
    assert len(set(train) & set(val)) == 0
    assert sorted([*train, *val]) == list(range(len(labels)))
    for label in range(10):
        in_class = np.sum(labels == label)
        assert abs(np.sum(labels[val] == label) - 0.2 * in_class) <= 0.5


def test_digits_split_is_pinned():
    # Regression pin: a cached teacher trained on the old train split would be scored on
    # its own training images if the split ever changed (e.g. with a library upgrade).
    val = digits_split_indices("val")
    assert len(val) == 359
    assert int(val.sum()) == PINNED_VAL_INDEX_SUM
    assert val[:5].tolist() == PINNED_FIRST_VAL_INDICES


def test_digits_val_is_independent_of_run_seed_and_augmentation():
    a = DigitsDataset("val", seed=0)
    b = DigitsDataset("val", seed=9, augment=True)
    assert not b.augment
    assert torch.equal(a.get_batch(range(len(a)))[0], b.get_batch(range(len(b)), epoch=4)[0])


def test_digits_tensors_are_normalised_with_train_statistics():
    train, val = DigitsDataset("train"), DigitsDataset("val")
    image, label = train[0]
    assert image.shape == (1, 32, 32) and image.dtype == torch.float32 and isinstance(label, int)
    assert abs(train.images.mean().item()) < 1e-4 and abs(train.images.std().item() - 1) < 1e-4
    assert val.normalization == train.normalization
    assert train.info == DatasetInfo(num_classes=10, in_chans=1, image_size=32)
    assert train.background == pytest.approx(-train.normalization.mean / train.normalization.std)
    assert train.images.min().item() == pytest.approx(train.background, abs=1e-5)


def test_digits_nearest_upsampling_repeats_the_original_pixels():
    from sklearn.datasets import load_digits
    raw = torch.from_numpy(load_digits().images).float()
    dataset = DigitsDataset("val", image_size=16, interpolation="nearest")
    norm = dataset.normalization
    index = int(digits_split_indices("val")[0])
    expected = raw[index].repeat_interleave(2, 0).repeat_interleave(2, 1) / 16
    restored = dataset[0][0][0] * norm.std + norm.mean
    torch.testing.assert_close(restored, expected, atol=1e-5, rtol=0)


def test_digits_augmentation_is_a_bounded_translation_seeded_by_epoch_and_index():
    plain = DigitsDataset("train", augment=False)
    augmented = DigitsDataset("train", augment=True, max_shift=2, seed=5)
    shifts = set()
    for index in range(40):
        image = augmented[index][0]
        matches = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                   if torch.equal(image, translate(plain[index][0], dy, dx, plain.background))]
        assert matches, f"sample {index} is not a translation of at most 2 px"
        shifts.add(matches[0])
        assert torch.equal(image, augmented[index][0])  # same (seed, epoch, index)
    assert len(shifts) > 5
    first_epoch = augmented.get_batch(range(40), epoch=0)[0]
    assert not torch.equal(first_epoch, augmented.get_batch(range(40), epoch=1)[0])
    assert torch.equal(first_epoch, augmented.get_batch(range(40), epoch=0)[0])
    assert torch.equal(augmented[-1][0], augmented[len(augmented) - 1][0])


def test_translate_moves_content_and_fills_the_border():
    image = torch.arange(16.0).reshape(1, 4, 4)
    assert torch.equal(translate(image, 0, 0, -1.0), image)
    down_right = translate(image, 1, 2, -1.0)
    assert torch.equal(down_right[0, 1:, 2:], image[0, :3, :2])
    assert (down_right[0, 0] == -1).all() and (down_right[0, :, :2] == -1).all()
    up_left = translate(image, -1, -1, 0.5)
    assert torch.equal(up_left[0, :3, :3], image[0, 1:, 1:])
    assert (translate(image, 4, 0, 7.0) == 7).all()


@pytest.mark.parametrize("kwargs, message", [
    ({"interpolation": "bicubic"}, "interpolation must be one of"),
    ({"image_size": 4}, "image_size must be an integer >= 8"),
    ({"max_shift": 16, "image_size": 16}, "max_shift=16 must be smaller than image_size=16"),
    ({"split": "test"}, r"split must be one of \['train', 'val'\]"),
])
def test_digits_rejects_bad_arguments(kwargs, message):
    with pytest.raises(DataError, match=message):
        DigitsDataset(**kwargs)


def test_index_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match="index 359 out of range"):
        DigitsDataset("val")[359]


# ----------------------------------------------------------------------------- ImageNet100

def write_image(path: Path, seed: int) -> None:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def fake_imagenet(root: Path, synsets, splits=("train", "val"), per_class: int = 1) -> Path:
    for split in splits:
        (root / split).mkdir(parents=True, exist_ok=True)
        for n, synset in enumerate(synsets):
            for k in range(per_class):
                suffix = ".JPEG" if (n + k) % 2 else ".png"
                write_image(root / split / synset / f"{synset}_{k}{suffix}", seed=n * 10 + k)
    return root


@pytest.fixture(scope="module")
def full_imagenet(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    fake_imagenet(root, imagenet100_synsets())
    write_image(root / "train" / "n99999999" / "other.png", seed=1)  # not in the list
    return root


def test_shipped_synset_list_has_100_unique_ids_without_trailing_newline():
    text = PACKAGE_SYNSETS.read_text()
    assert not text.endswith("\n")
    assert len(text.split("\n")) == 100 == len(set(text.split("\n")))
    assert imagenet100_synsets() == tuple(sorted(text.split("\n")))
    assert text == SHARED_SYNSETS.read_text()  # tests/data holds the list as the project received it


@pytest.mark.parametrize("root", [None, "", "  "])
def test_unset_root_is_an_error(root):
    with pytest.raises(DataError, match="root is not set.*train/"):
        check_imagenet100_root(root)


def test_missing_root_is_an_error(tmp_path):
    with pytest.raises(DataError, match=r"'.*nowhere' does not exist"):
        check_imagenet100_root(tmp_path / "nowhere")


def test_root_that_is_a_file_is_an_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="is a file, not a folder"):
        check_imagenet100_root(tmp_path / "file")


@pytest.mark.parametrize("present, absent", [(("val",), "train"), (("train",), "val")])
def test_missing_split_folder_is_an_error(tmp_path, present, absent):
    fake_imagenet(tmp_path, imagenet100_synsets()[:1], splits=present)
    with pytest.raises(DataError, match=f"has no {absent}/ folder \\(it holds: {present[0]}\\)"):
        check_imagenet100_root(tmp_path)


def test_both_split_folders_missing_are_named_together(tmp_path):
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match=r"has no train/ or val/ folder \(it holds: images\)"):
        check_imagenet100_root(tmp_path)


def test_missing_synsets_are_counted_and_the_first_few_named(tmp_path):
    synsets = imagenet100_synsets()
    fake_imagenet(tmp_path, synsets[:3])
    expected = f"lacks 97 of 100 synset folders \\(first missing: {', '.join(synsets[3:8])}, \\.\\.\\.\\)"
    with pytest.raises(DataError, match=expected):
        check_imagenet100_root(tmp_path)


def test_flat_val_folder_gets_a_sorting_hint(full_imagenet, tmp_path):
    fake_imagenet(tmp_path, imagenet100_synsets(), splits=("train",))
    write_image(tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG", seed=0)
    with pytest.raises(DataError, match="val/ holds image files directly: sort them"):
        check_imagenet100_root(tmp_path)


def test_synset_folder_without_images_is_an_error(tmp_path):
    synsets = imagenet100_synsets()
    fake_imagenet(tmp_path, synsets)
    for synset in synsets[:2]:
        (tmp_path / "val" / synset / f"{synset}_0.png").unlink(missing_ok=True)
        (tmp_path / "val" / synset / f"{synset}_0.JPEG").unlink(missing_ok=True)
        (tmp_path / "val" / synset / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match=f"val/ has 2 synset folders without any image file.*{synsets[0]}"):
        check_imagenet100_root(tmp_path)


def test_complete_tree_passes_and_extra_synsets_are_ignored(full_imagenet):
    assert check_imagenet100_root(str(full_imagenet)) == full_imagenet
    dataset = ImageNet100(full_imagenet, "train", image_size=8)
    assert len(dataset) == 100 and "n99999999" not in dataset.folder.class_to_idx


def test_class_index_is_the_sorted_position_in_both_splits(full_imagenet):
    synsets = imagenet100_synsets()
    for split in ("train", "val"):
        dataset = ImageNet100(full_imagenet, split, image_size=8)
        assert dataset.targets == list(range(100))
        for path, target in dataset.folder.samples:
            assert Path(path).parent.name == synsets[target]


def test_imagenet_items_have_the_configured_shape_and_val_is_deterministic(full_imagenet):
    val = ImageNet100(full_imagenet, "val", image_size=8)
    image, label = val[5]
    assert image.shape == (3, 8, 8) and image.dtype == torch.float32 and label == 5
    assert torch.equal(image, val[5][0])
    assert val.info == DatasetInfo(num_classes=100, in_chans=3, image_size=8)


def test_imagenet_train_augmentation_is_seeded_and_leaves_global_rng_alone(full_imagenet):
    train = ImageNet100(full_imagenet, "train", image_size=8, seed=1)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    epoch0 = train.get_batch(range(20), epoch=0)[0]
    assert torch.equal(torch.rand(3), expected_next)
    assert torch.equal(epoch0, train.get_batch(range(20), epoch=0)[0])
    assert not torch.equal(epoch0, train.get_batch(range(20), epoch=1)[0])
    other_seed = ImageNet100(full_imagenet, "train", image_size=8, seed=2)
    assert not torch.equal(epoch0, other_seed.get_batch(range(20), epoch=0)[0])


def test_imagenet_dataset_validates_the_root_first(tmp_path):
    (tmp_path / "val").mkdir()
    with pytest.raises(DataError, match="has no train/ folder"):
        ImageNet100(tmp_path, "val")


# ----------------------------------------------------------------------------- synthetic

def test_synthetic_items_are_deterministic_per_index_in_any_order():
    make = lambda: SyntheticImages(num_samples=60, num_classes=4, image_size=6, in_chans=2, seed=3)  # noqa: E731
    dataset = make()
    forward = [dataset[i] for i in range(60)]
    backward = [dataset[i] for i in reversed(range(60))][::-1]
    fresh = make()
    for i, ((x, y), (x2, y2)) in enumerate(zip(forward, backward)):
        x3, y3 = fresh[i]
        assert torch.equal(x, x2) and torch.equal(x, x3) and y == y2 == y3
    assert forward[0][0].shape == (2, 6, 6) and forward[0][0].dtype == torch.float32
    assert {y for _, y in forward} == {0, 1, 2, 3}
    assert not torch.equal(forward[0][0], forward[1][0])


def test_synthetic_streams_differ_by_seed_and_split():
    base = SyntheticImages(num_samples=4, image_size=4)[0][0]
    assert not torch.equal(base, SyntheticImages(num_samples=4, image_size=4, seed=1)[0][0])
    assert not torch.equal(base, SyntheticImages("val", num_samples=4, image_size=4)[0][0])


@pytest.mark.parametrize("kwargs", [{"num_samples": 0}, {"num_classes": 0}, {"image_size": -1},
                                    {"in_chans": 0}])
def test_synthetic_rejects_bad_sizes(kwargs):
    with pytest.raises(DataError, match=next(iter(kwargs))):
        SyntheticImages(**kwargs)


# ----------------------------------------------------------------------------- registry

def test_registry_names():
    assert dataset_names() == ["digits", "imagenet100", "synthetic"]


def test_build_dataset_builds_each_kind(full_imagenet):
    assert isinstance(build_dataset("digits", "val", image_size=16), DigitsDataset)
    assert isinstance(build_dataset("synthetic", "train", num_samples=3), SyntheticImages)
    built = build_dataset("imagenet100", "val", root=full_imagenet, image_size=8)
    assert isinstance(built, ImageNet100) and built.split == "val"


@pytest.mark.parametrize("name, kwargs", [
    ("digits", {"image_size": 24, "augment": True, "seed": 3}),
    ("synthetic", {"num_classes": 7, "image_size": 10, "in_chans": 1, "num_samples": 2}),
])
def test_dataset_info_matches_the_built_dataset(name, kwargs):
    info = dataset_info(name, **kwargs)
    dataset = build_dataset(name, "train", **kwargs)
    assert info == dataset.info
    image, _ = dataset[0]
    assert image.shape == (info.in_chans, info.image_size, info.image_size)


def test_dataset_info_reads_no_data():
    info = dataset_info("imagenet100", root="/does/not/exist", image_size=160, seed=4)
    assert info == DatasetInfo(num_classes=100, in_chans=3, image_size=160)
    assert dataset_info("digits") == DatasetInfo(10, 1, 32)
    assert dataset_info("synthetic") == DatasetInfo(100, 3, 224)


def test_unknown_name_lists_the_valid_ones():
    message = r"unknown data set 'imagenet'; valid names: \['digits', 'imagenet100', 'synthetic'\]"
    with pytest.raises(DataError, match=message):
        build_dataset("imagenet", "train")
    with pytest.raises(DataError, match=message):
        dataset_info("imagenet")


def test_unknown_argument_lists_the_accepted_ones():
    with pytest.raises(DataError, match=r"no argument\(s\) \['imagesize'\]; it accepts: \['image_size'"):
        dataset_info("digits", imagesize=3)
    with pytest.raises(DataError, match=r"no argument\(s\) \['rooot'\]"):
        build_dataset("imagenet100", "train", rooot="/x")


def test_bad_split_and_bad_info_values_are_errors():
    with pytest.raises(DataError, match="split must be one of"):
        build_dataset("digits", "training")
    with pytest.raises(DataError, match="image_size must be an integer >= 8"):
        dataset_info("digits", image_size=4)
