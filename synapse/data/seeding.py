"""Stable seeds derived from tuples such as (run seed, epoch, sample index).

Why not ``hash((seed, epoch))``: Python's ``hash`` of a ``str`` changes per process
(PYTHONHASHSEED), and nothing promises that tuple hashing stays the same across Python
versions. A resumed run may be a fresh process on another machine, so the seed of
epoch 3 must be computed the same way everywhere: we hash the decimal/text form of the
parts with BLAKE2b, which is fixed by its specification.
"""
from __future__ import annotations

import hashlib

import torch

SeedPart = int | str

# torch.Generator.manual_seed accepts any 64-bit value; staying below 2**63 keeps the
# seed a valid signed int64 as well (handy when it is stored in a tensor or a checkpoint).
_SEED_MASK = (1 << 63) - 1


def derive_seed(*parts: SeedPart) -> int:
    """Return a seed in [0, 2**63) that depends only on ``parts`` (order matters)."""
    if not parts:
        raise ValueError("derive_seed needs at least one part, e.g. derive_seed(seed, epoch)")
    for part in parts:
        # bool is an int subclass; True and 1 would collide, and a bool seed is a bug.
        if isinstance(part, bool) or not isinstance(part, (int, str)):
            raise TypeError(f"seed parts must be int or str, got {part!r} ({type(part).__name__})")
    # Tag each part with its type so that ("1",) and (1,) give different seeds.
    text = "\x1f".join(f"{'i' if isinstance(p, int) else 's'}:{p}" for p in parts)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


def seeded_generator(*parts: SeedPart) -> torch.Generator:
    """A fresh CPU ``torch.Generator`` seeded with ``derive_seed(*parts)``."""
    return torch.Generator().manual_seed(derive_seed(*parts))
