"""The guard inside vLLM: installed, memfree registers :class:`MemFreeLogitsProcessor` under
vLLM's ``vllm.logits_processors`` entry points, and vLLM builds it in every engine. Configured, it
guards every request; not configured, it does nothing.

Served (OpenAI-compatible), with no memfree flag::

    MEMFREE_FILTER=stdlib.memfree python -m vllm.entrypoints.openai.api_server --model ...

or ``--additional-config '{"memfree": {"filter": "stdlib.memfree"}}'``. Offline::

    llm = LLM(model=..., additional_config={"memfree": {"filter": "stdlib.memfree"}})

The one class works under the V1 runner and Model Runner V2 (vLLM picks the runner; the class
picks its implementation from how vLLM builds it). ``MemFreeV1LogitsProcessor`` and
``MemFreeV2LogitsProcessor``, the names of earlier releases, are the same class. The policy
(every request guarded; opt-out only where the operator allows it) is in
:mod:`memfree.engines.policy`.
"""

from __future__ import annotations

from memfree.engines.policy import ServingConfig, ServingConfigError
from memfree.engines.vllm_plugin import MemFreeLogitsProcessor

#: The names of earlier releases, one per runner: now the one class, which works under both.
MemFreeV1LogitsProcessor = MemFreeLogitsProcessor
MemFreeV2LogitsProcessor = MemFreeLogitsProcessor

__all__ = [
    "MemFreeLogitsProcessor",
    "MemFreeV1LogitsProcessor",
    "MemFreeV2LogitsProcessor",
    "ServingConfig",
    "ServingConfigError",
]
