"""Data: the embedded digits default, ImageNet100 (CPU or on-device JPEG decoding), synthetic
images generated on the device, and a deterministic, resumable sampler. Start with
``build_dataset``/``dataset_info`` and ``ResumableSampler``.
"""
from synapse.data.base import DataError, DataLayoutWarning, DatasetInfo, EpochDataset
from synapse.data.crops import (
    CROP_ATTEMPTS,
    VALIDATION_DRAW,
    CropDraw,
    crop_box,
    draw_train_crop,
    normalize_uint8,
    resized_crop,
    resized_crops,
)
from synapse.data.digits import DigitsDataset, digits_split_indices, translate
from synapse.data.host_path import HostDataPath, choose_host_data_path
from synapse.data.imagenet100 import IMAGENET_MEAN, ImageNet100, check_imagenet100_root, imagenet100_synsets
from synapse.data.jpeg import BadSample, decode_cpu, device_decodable, device_decoding_available, jpeg_frame, read_bytes
from synapse.data.registry import (
    build_dataset,
    build_datasets,
    data_kwargs,
    dataset_decodes_files,
    dataset_info,
    dataset_lazy_imports,
    dataset_names,
    train_samples,
)
from synapse.data.sampler import BatchIndexSampler, IndexBatch, ResumableSampler, epoch_batches, iterate_batches
from synapse.data.seeding import derive_seed, seeded_generator
from synapse.data.synthetic import SyntheticImages

__all__ = ["BadSample", "BatchIndexSampler", "CROP_ATTEMPTS", "CropDraw", "DataError", "DataLayoutWarning",
           "DatasetInfo", "DigitsDataset", "EpochDataset", "HostDataPath", "IMAGENET_MEAN", "ImageNet100",
           "IndexBatch", "ResumableSampler", "SyntheticImages", "VALIDATION_DRAW", "build_dataset",
           "build_datasets", "check_imagenet100_root", "choose_host_data_path", "crop_box", "data_kwargs",
           "dataset_decodes_files", "dataset_info", "dataset_lazy_imports", "dataset_names", "decode_cpu",
           "derive_seed", "device_decodable", "device_decoding_available", "digits_split_indices",
           "draw_train_crop", "epoch_batches", "imagenet100_synsets", "iterate_batches", "jpeg_frame",
           "normalize_uint8", "read_bytes", "resized_crop", "resized_crops", "seeded_generator",
           "train_samples", "translate"]
