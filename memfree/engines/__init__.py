"""The guard inside serving engines: thin adapters over the engine-neutral core.

- :mod:`memfree.integrations.vllm`: ``MemFreeV1LogitsProcessor`` (vLLM's V1 model runner) and
  ``MemFreeV2LogitsProcessor`` (Model Runner V2), configured by
  ``additional_config={"memfree": {...}}`` (:mod:`memfree.integrations.policy`).
- :mod:`memfree.integrations.llama_cpp`: ``MemFreeLlamaCppLogitsProcessor`` for
  llama-cpp-python's ``logits_processor=``; it fails closed.

Each adapter turns its engine's rows into the core's input (:mod:`memfree.integrations.rows`)
and edits the scores as the transformers guard does (:mod:`memfree.guard`). None of them imports
its engine at module level beyond the base class vLLM requires, so each is tested here against
replicas of the engine's objects.
"""
