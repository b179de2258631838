"""``memfree.processor``: the transformers guard's public path (``MemFreeLogitsProcessor``).

The processor lives in :mod:`memfree.engines.transformers`; this module keeps the path stable.
"""

from __future__ import annotations

from memfree.engines.transformers import MemFreeLogitsProcessor

__all__ = ["MemFreeLogitsProcessor"]
