"""The guard inside vLLM: installed, memfree registers :class:`MemFreeVllmLogitsProcessor` under
vLLM's ``vllm.logits_processors`` entry points, and vLLM builds it in every engine. Configured, it
guards every request; not configured, it does nothing.

Served (OpenAI-compatible), with no memfree flag::

    MEMFREE_FILTER=stdlib.memfree python -m vllm.entrypoints.openai.api_server --model ...

or ``--additional-config '{"memfree": {"filter": "stdlib.memfree"}}'``. Offline::

    llm = LLM(model=..., additional_config={"memfree": {"filter": "stdlib.memfree"}})

The one class works under the V1 runner and Model Runner V2 (vLLM picks the runner; the class
picks its implementation from how vLLM builds it). ``MemFreeV1LogitsProcessor`` and
``MemFreeV2LogitsProcessor``, the names of earlier releases, are the same class, and so is
``MemFreeLogitsProcessor``, its name until it was told apart from the transformers processor of
that name (server flags that name it keep working). The policy
(every request guarded; opt-out only where the operator allows it) is in
:mod:`memfree.engines.policy`.
"""

from __future__ import annotations

from memfree.engines.policy import ServingConfig, ServingConfigError
from memfree.engines.vllm_plugin import MemFreeVllmLogitsProcessor

#: The names of earlier releases, one per runner: now the one class, which works under both.
MemFreeV1LogitsProcessor = MemFreeVllmLogitsProcessor
MemFreeV2LogitsProcessor = MemFreeVllmLogitsProcessor
#: Its name until 2026-11-28 (the transformers processor has that name): kept for server flags.
MemFreeLogitsProcessor = MemFreeVllmLogitsProcessor

__all__ = [
    "MemFreeV1LogitsProcessor",
    "MemFreeV2LogitsProcessor",
    "MemFreeVllmLogitsProcessor",
    "ServingConfig",
    "ServingConfigError",
]
