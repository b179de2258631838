"""``memfree.integrations.vllm``: the path of memfree's ``vllm.logits_processors`` entry point
(``memfree.integrations.vllm:MemFreeVllmLogitsProcessor``), and the one operators may pass to
``--logits-processors`` (``...:MemFreeLogitsProcessor``, its earlier name, still works).

The adapters live in :mod:`memfree.engines.vllm`; this module keeps the public path stable.
"""

from __future__ import annotations

from memfree.engines.vllm import (
    MemFreeLogitsProcessor,  # noqa: F401  # its earlier name, kept for server flags (not in __all__)
    MemFreeV1LogitsProcessor,
    MemFreeV2LogitsProcessor,
    MemFreeVllmLogitsProcessor,
    ServingConfig,
    ServingConfigError,
)

__all__ = [
    "MemFreeV1LogitsProcessor",
    "MemFreeV2LogitsProcessor",
    "MemFreeVllmLogitsProcessor",
    "ServingConfig",
    "ServingConfigError",
]
