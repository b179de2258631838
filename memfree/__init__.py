"""memfree: keep language models from emitting n-grams of their training data (MemFree decoding).

Ippolito et al., "Preventing Verbatim Memorization in Language Models Gives a False Sense of
Privacy" (2023). Heavy modules load on first use; importing memfree itself is cheap.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from memfree.errors import (
    DamagedFilterError,
    FilterChangedError,
    FilterError,
    FilterMismatchError,
)
from memfree.filterfile import NgramFilter

if TYPE_CHECKING:
    from memfree.engines.stats import GuardStats
    from memfree.engines.transformers import MemFreeLogitsProcessor
    from memfree.models import load_model

try:  # the one version: pyproject.toml's, as installed
    __version__ = _version("memfree")
except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
    __version__ = "0+unknown"
__all__ = [
    "DamagedFilterError",
    "FilterChangedError",
    "FilterError",
    "FilterMismatchError",
    "GuardStats",
    "MemFreeLogitsProcessor",
    "NgramFilter",
    "__version__",
    "load_model",
]

_LAZY = {
    "MemFreeLogitsProcessor": "memfree.engines.transformers",
    "GuardStats": "memfree.engines.stats",
    "load_model": "memfree.models",
}


def __getattr__(name: str) -> Any:
    """Import the torch-heavy parts (the guard, model loading) on first use."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'memfree' has no attribute {name!r}")
