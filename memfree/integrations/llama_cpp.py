"""``memfree.integrations.llama_cpp``: the llama-cpp-python guard's public path.

The adapter lives in :mod:`memfree.engines.llama_cpp`; this module keeps the public path stable.
"""

from __future__ import annotations

from memfree.engines.llama_cpp import MemFreeLlamaCppLogitsProcessor

__all__ = ["MemFreeLlamaCppLogitsProcessor"]
