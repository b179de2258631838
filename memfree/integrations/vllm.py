"""``memfree.integrations.vllm``: the path of memfree's ``vllm.logits_processors`` entry point
(``memfree.integrations.vllm:MemFreeLogitsProcessor``), and the one operators may pass to
``--logits-processors``.

The adapters live in :mod:`memfree.engines.vllm`; this module keeps the public path stable.
"""

from __future__ import annotations

from memfree.engines.vllm import (
    MemFreeLogitsProcessor,
    MemFreeV1LogitsProcessor,
    MemFreeV2LogitsProcessor,
    ServingConfig,
    ServingConfigError,
)

__all__ = [
    "MemFreeLogitsProcessor",
    "MemFreeV1LogitsProcessor",
    "MemFreeV2LogitsProcessor",
    "ServingConfig",
    "ServingConfigError",
]
