"""Data: the embedded digits default, ImageNet100 (CPU or on-device JPEG decoding), synthetic
images generated on the device, and a deterministic, resumable sampler. Start with ``build_dataset``/``dataset_info`` and ``ResumableSampler``."""
from synapse.data.base import DatasetInfo, EpochDataset
from synapse.data.digits import DigitsDataset
from synapse.data.errors import DataError
from synapse.data.from_config import build_datasets, data_kwargs
from synapse.data.jpeg import BadSample
from synapse.data.imagenet100 import ImageNet100, check_imagenet100_root, imagenet100_synsets
from synapse.data.registry import build_dataset, dataset_info, dataset_lazy_imports, dataset_names
from synapse.data.sampler import (
    BatchIndexSampler,
    IndexBatch,
    ResumableSampler,
    epoch_batches,
    iterate_batches,
)
from synapse.data.synthetic import SyntheticImages

__all__ = [
    "BadSample",
    "BatchIndexSampler",
    "DataError",
    "DatasetInfo",
    "DigitsDataset",
    "EpochDataset",
    "ImageNet100",
    "IndexBatch",
    "ResumableSampler",
    "SyntheticImages",
    "build_datasets",
    "data_kwargs",
    "build_dataset",
    "check_imagenet100_root",
    "dataset_info",
    "dataset_lazy_imports",
    "dataset_names",
    "epoch_batches",
    "imagenet100_synsets",
    "iterate_batches",
]
