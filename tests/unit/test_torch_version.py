"""The supported-torch floor: an older torch is refused before any work, naming what to install."""
from __future__ import annotations

import pytest

from synapse.config import OLDEST_SUPPORTED, ConfigError, UnsupportedTorchError, require_supported_torch, torch_version


@pytest.mark.parametrize("version, parsed", [("2.14.1+cu130", (2, 14)), ("2.11.0", (2, 11)),
                                             ("2.12.0a0+git1234", (2, 12)), ("3.0.0.dev20270101", (3, 0))])
def test_versions_are_read_as_major_minor(version, parsed):
    assert torch_version(version) == parsed


@pytest.mark.parametrize("version", ["2.9.1+cu128", "2.10.0", "1.13.1"])
def test_a_torch_older_than_the_floor_is_refused_with_the_install_command(version):
    with pytest.raises(UnsupportedTorchError) as refused:
        require_supported_torch(version)
    message = str(refused.value)
    assert f"torch {version} is installed" in message and "pip install 'torch>=2.11'" in message
    assert isinstance(refused.value, ConfigError)  # train.py prints it as one line and exits 2


@pytest.mark.parametrize("version", ["2.11.0+cu130", "2.14.1", "3.0.0"])
def test_supported_releases_pass(version):
    require_supported_torch(version)


def test_the_installed_torch_is_supported():
    assert torch_version() >= OLDEST_SUPPORTED
    require_supported_torch()
