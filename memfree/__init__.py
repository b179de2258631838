"""memfree: keep language models from emitting n-grams of their training data (MemFree decoding).

Ippolito et al., "Preventing Verbatim Memorization in Language Models Gives a False Sense of
Privacy" (2023). Heavy modules load on first use; importing memfree itself is cheap.
"""

from __future__ import annotations

from memfree.errors import DamagedFilterError, FilterError, FilterMismatchError
from memfree.filter import NgramFilter

__version__ = "0.1.0"
__all__ = [
    "DamagedFilterError",
    "FilterError",
    "FilterMismatchError",
    "NgramFilter",
    "__version__",
]
