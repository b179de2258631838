"""``memfree.integrations.vllm``: the path operators pass to ``--logits-processors``.

The adapters live in :mod:`memfree.engines.vllm`; this module keeps the public path stable.
"""

from __future__ import annotations

from memfree.engines.vllm import (
    MemFreeV1LogitsProcessor,
    MemFreeV2LogitsProcessor,
    ServingConfig,
    ServingConfigError,
)

__all__ = [
    "MemFreeV1LogitsProcessor",
    "MemFreeV2LogitsProcessor",
    "ServingConfig",
    "ServingConfigError",
]
