"""Fixtures of the multi-process tests."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from synapse.models import build_model


@pytest.fixture(scope="session")
def teacher_file(tmp_path_factory) -> Path:
    """A randomly initialised resnet_micro teacher for digits (equivalence needs no trained teacher)."""
    path = tmp_path_factory.mktemp("teacher") / "teacher.pt"
    torch.manual_seed(1234)
    torch.save(build_model("resnet_micro", 10, 1, 32).state_dict(), path)
    return path
