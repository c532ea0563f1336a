"""Import vLLM-Omni's shared-memory connector without vLLM (which ships CUDA-only wheels).

vLLM-Omni 0.30.0 comes from PyPI, installed with no dependencies into a folder of its own
(`python -m loadtest.peers.setup omni`). Its connector's import chain touches a handful of
vLLM names, none of them on the put/get path; `install()` registers stand-ins for exactly
those, in memory, and registers four vLLM-Omni packages without running their
`__init__.py` (they import hundreds of vLLM modules to patch and register models). Every
module then loaded for the measurement is vLLM-Omni's own file, unchanged:

stand-in (what it is)                                   needed by
vllm.outputs.CompletionOutput, RequestOutput (empty)     utils/serialization.py (isinstance)
vllm.logger.init_logger (logging.getLogger)              platforms/interface.py
vllm.envs.VLLM_PLUGINS (None: no plugins)                plugins/__init__.py
vllm.config.CUDAGraphMode, VllmConfig (empty)            platforms/interface.py (annotations)
vllm.forward_context.BatchDescriptor (empty)             platforms/interface.py (annotations)
vllm.platforms.Platform (empty base class)               platforms/interface.py
vllm.platforms.interface.PlatformEnum (UNSPECIFIED)      platforms/interface.py
vllm.utils.import_utils.resolve_obj_by_qualname          platforms/__init__.py

There is no `import_pynvml`, so vLLM-Omni's platform detection finds no GPU and settles on
its own UnspecifiedOmniPlatform, as on any CPU-only host.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

from loadtest.peers.setup import home

BARE = (
    "vllm_omni",
    "vllm_omni.distributed",
    "vllm_omni.distributed.omni_connectors",
    "vllm_omni.config",
)
CONNECTOR = "vllm_omni.distributed.omni_connectors.connectors.shm_connector"


def omni_dir() -> Path:
    return home() / "omni"


class _Empty:
    """Stands for a vLLM class that is only named (annotations, isinstance)."""


class _PlatformEnum(enum.Enum):
    UNSPECIFIED = enum.auto()


class _CUDAGraphMode(enum.Enum):
    NONE = 0


def _resolve(qualname: str) -> Any:
    module, _, attr = qualname.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _module(name: str, **names: Any) -> None:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so submodules resolve from sys.modules
    for key, value in names.items():
        setattr(module, key, value)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def _vllm_stand_ins() -> None:
    _module("vllm")
    completion, request = (
        type(name, (_Empty,), {}) for name in ("CompletionOutput", "RequestOutput")
    )
    _module("vllm.outputs", CompletionOutput=completion, RequestOutput=request)
    _module("vllm.logger", init_logger=logging.getLogger)
    _module("vllm.envs", VLLM_PLUGINS=None)
    _module("vllm.config", CUDAGraphMode=_CUDAGraphMode, VllmConfig=_Empty)
    _module("vllm.forward_context", BatchDescriptor=_Empty)
    _module("vllm.platforms", Platform=type("Platform", (), {}))
    _module("vllm.platforms.interface", PlatformEnum=_PlatformEnum)
    _module("vllm.utils")
    _module("vllm.utils.import_utils", resolve_obj_by_qualname=_resolve)


def _bare_package(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not installed: run python -m loadtest.peers.setup omni")
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__package__ = name
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)


def install() -> Any:
    """vLLM-Omni's SharedMemoryConnector class (idempotent; also in spawned children)."""
    if CONNECTOR in sys.modules:
        return sys.modules[CONNECTOR].SharedMemoryConnector
    folder = str(omni_dir())
    if not Path(folder, "vllm_omni").is_dir():
        raise SystemExit(f"{folder}/vllm_omni is missing: run python -m loadtest.peers.setup omni")
    if folder not in sys.path:
        sys.path.append(folder)
    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is not None:
        raise SystemExit("a real vllm is importable here: refusing to stand in for it")
    if "vllm" not in sys.modules:
        _vllm_stand_ins()
    for name in BARE:
        if name not in sys.modules:
            _bare_package(name)
    return importlib.import_module(CONNECTOR).SharedMemoryConnector
