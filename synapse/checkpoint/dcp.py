"""The tensors of a checkpoint in torch.distributed.checkpoint (DCP) storage, read safely.

Format version 2 keeps the student's tensors and their optimizer state in DCP: one flat state
dict per rank, keyed ``model/<parameter name>`` and ``optim/<parameter name>/<state key>``, so
ranks of any partition write disjoint keys into one checkpoint with one global ``.metadata``
(DCP's own), and any partition and rank count reads any key back by name.

DCP reads its ``.metadata`` with ``pickle`` and non-tensor values with
``torch.load(weights_only=False)`` (torch 2.11 and 2.14 alike); here the metadata goes through
an unpickler that rebuilds only DCP's metadata types, and values through
``torch.load(weights_only=True)``: a checkpoint can never run code.
"""
from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.staging import AsyncStager

METADATA_FILE = ".metadata"  # DCP's name for its global index
MODEL, OPTIM, RNG = "model/", "optim/", "rng/"

# Without a process group DCP warns on every call that it assumes one process: that is the intent here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_PATH_CLASSES = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}


class _MetadataUnpickler(pickle.Unpickler):
    """Rebuilds DCP's metadata (its dataclasses, torch.Size, dtypes, paths) and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            module == _METADATA_MODULE
            or (module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo")
            or (module == "pathlib" and name in _PATH_CLASSES)
            or (module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)))
            or (module == "torch.serialization" and name == "_get_layout")
            or (module == "collections" and name == "OrderedDict"))
        if not allowed:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")
        found = super().find_class(module, name)
        if module == _METADATA_MODULE and not isinstance(found, type):
            raise pickle.UnpicklingError(f"{module}.{name} is not a metadata type")
        return found


class SafeReader(FileSystemReader):
    """DCP's file reader, with the metadata rebuilt by ``_MetadataUnpickler`` instead of ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(io.BytesIO(stream.read())).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path} does not hold DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's planner for a flat state dict, loading non-tensor values with ``weights_only=True``."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self.state_dict[read_item.dest_index.fqn] = torch.load(value, weights_only=True)


def flat_state(model: Mapping[str, torch.Tensor], optim: Mapping[str, Mapping[str, Any]],
               rng: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """One rank's tensors, optimizer state and RNG states as DCP keys (names hold dots, never slashes)."""
    flat: dict[str, Any] = {MODEL + name: tensor for name, tensor in model.items()}
    for name, state in optim.items():
        flat.update({f"{OPTIM}{name}/{key}": value for key, value in state.items()})
    for rank, states in (rng or {}).items():
        flat.update({f"{RNG}{rank:02d}/{key}": value for key, value in states.items()})
    return flat


def rng_by_rank(flat: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """Each rank's RNG states from ``flat_state``'s keys."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in flat.items():
        if key.startswith(RNG):
            rank, _, name = key[len(RNG):].partition("/")
            found.setdefault(int(rank), {})[name] = value
    return found


def split_state(flat: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """The inverse of ``flat_state``: (model state, optimizer state by parameter name)."""
    model: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if key.startswith(MODEL):
            model[key[len(MODEL):]] = value
        elif key.startswith(OPTIM):
            name, _, state_key = key[len(OPTIM):].rpartition("/")
            optim.setdefault(name, {})[state_key] = value
    return model, optim


def failures(exc: BaseException) -> list[BaseException]:
    """The exceptions a ``CheckpointException`` (one per failed rank, or the exception itself) carries."""
    if isinstance(exc, CheckpointException):
        return [item[0] if isinstance(item, tuple) else item for item in exc.failures.values()]
    return [exc]


def first_failure(exc: BaseException) -> BaseException:
    found = failures(exc)
    return found[0] if found else exc


def is_dcp_checkpoint(path: Path) -> bool:
    return (Path(path) / METADATA_FILE).is_file()


def read_metadata(path: Path) -> Metadata:
    return SafeReader(str(path)).read_metadata()


def storage_files(path: Path) -> set[str]:
    """The files (relative to ``path``) DCP reads tensors and values from, by the metadata."""
    storage = read_metadata(path).storage_data or {}
    return {info.relative_path for info in storage.values()}


def model_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Shape of every student tensor, from the metadata alone (no tensor data is read)."""
    entries = read_metadata(path).state_dict_metadata
    return {key[len(MODEL):]: tuple(item.size) for key, item in entries.items()
            if key.startswith(MODEL) and isinstance(item, TensorStorageMetadata)}


def read_state(path: Path) -> dict[str, Any]:
    """Every entry of a DCP checkpoint, read in this process alone (no collectives)."""
    entries = read_metadata(path).state_dict_metadata
    target: dict[str, Any] = {key: torch.empty(tuple(item.size), dtype=item.properties.dtype)
                              if isinstance(item, TensorStorageMetadata) else None for key, item in entries.items()}
    if target:
        dcp.load(target, storage_reader=SafeReader(str(path)), planner=_SafeLoadPlanner(), no_dist=True)
    return target


def start_save(flat: Mapping[str, Any], path: Path, stager: AsyncStager,
               group: dist.ProcessGroup | None) -> Future:
    """``dcp.async_save`` of this rank's entries into ``path``: staged by ``stager`` before it returns,
    written by DCP's thread (collectives on ``group``, the checkpoint's own; none without one)."""
    writer = FileSystemWriter(str(path), single_file_per_rank=True, sync_files=True)
    return dcp.async_save(dict(flat), storage_writer=writer, process_group=group, async_stager=stager,
                          no_dist=group is None)
