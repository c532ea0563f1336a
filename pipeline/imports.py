"""`module:attribute` references, as graph files name engines and transforms."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(spec: str) -> Any:
    """The object `spec` names; ValueError says what is wrong with it."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form module:name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r}: {exc}") from None
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} has no {attr!r}")
    return getattr(module, attr)
