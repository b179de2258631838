"""The guard inside vLLM: pass a class, vLLM builds it per engine.

Offline::

    from vllm import LLM, SamplingParams
    from memfree.engines.vllm import MemFreeV1LogitsProcessor

    llm = LLM(model=..., logits_processors=[MemFreeV1LogitsProcessor],
              additional_config={"memfree": {"filter": "stdlib.memfree"}})

Served (OpenAI-compatible)::

    python -m vllm.entrypoints.openai.api_server --model ... \\
        --logits-processors memfree.integrations.vllm:MemFreeV1LogitsProcessor \\
        --additional-config '{"memfree": {"filter": "stdlib.memfree"}}'

:class:`MemFreeV1LogitsProcessor` is for the V1 model runner (vLLM's default),
:class:`MemFreeV2LogitsProcessor` for Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``). The
policy (every request guarded; opt-out only where the operator allows it) is in
:mod:`memfree.engines.policy`.
"""

from __future__ import annotations

from memfree.engines.policy import ServingConfig, ServingConfigError
from memfree.engines.vllm_v1 import MemFreeV1LogitsProcessor
from memfree.engines.vllm_v2 import MemFreeV2LogitsProcessor

__all__ = [
    "MemFreeV1LogitsProcessor",
    "MemFreeV2LogitsProcessor",
    "ServingConfig",
    "ServingConfigError",
]
