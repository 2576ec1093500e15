"""Synapse: fault-tolerant, pipeline-parallel knowledge distillation."""
from __future__ import annotations

import sys
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType

__version__ = "0.1.0"


def _load_the_checkout_s_conf() -> ModuleType | None:
    """In a source checkout, load the checkout's own top-level ``conf/`` as ``synapse.conf``.

    The wheel installs conf/ as synapse/conf/, where the ordinary import finds it. In a checkout the
    config groups sit beside synapse/, and which folder an import would find depends on what is
    installed: an editable install maps ``synapse.conf`` to the conf/ of the checkout it was made
    from (another one, when this checkout is only on PYTHONPATH), and a synapse/conf/ folder left
    behind by the older layout (its __pycache__) would be found first, as an empty namespace
    package. Loaded here, a checkout always composes its own configs. None where synapse is installed.
    """
    package_dir = Path(__file__).resolve().parent
    checkout = package_dir.parent
    conf_init = checkout / "conf" / "__init__.py"
    installed = (package_dir / "conf" / "__init__.py").is_file()
    if installed or not conf_init.is_file() or not (checkout / "pyproject.toml").is_file():
        return None
    spec = spec_from_file_location(f"{__name__}.conf", conf_init, submodule_search_locations=[str(conf_init.parent)])
    if spec is None or spec.loader is None:  # never for a .py file; this narrows the types
        raise ImportError(f"cannot load the config groups' package from {conf_init}")
    conf = module_from_spec(spec)
    sys.modules[spec.name] = conf
    spec.loader.exec_module(conf)
    return conf


_checkout_conf = _load_the_checkout_s_conf()
if _checkout_conf is not None:
    conf = _checkout_conf  # the attribute the import system sets on a package for a submodule it loads
