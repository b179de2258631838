"""The guard inside every engine: one shared setup and thin adapters over the engine-neutral core.

- :mod:`~memfree.engines.setup`: :class:`GuardSetup` (the filter, its unit, the exempt and
  end-of-sequence ids, the unit's masker, the file watch; every argument checked once);
  :mod:`~memfree.engines.scores`: how a step's scores are edited (``ban_scores``, ``fail_closed``).
- :mod:`~memfree.engines.transformers`: ``MemFreeLogitsProcessor`` for ``generate()``, with its
  statistics (:mod:`~memfree.engines.stats`).
- :mod:`~memfree.engines.rows`: ragged rows, as serving engines keep them, for the core.
- :mod:`~memfree.engines.vllm` (``vllm_v1``, ``vllm_v2``, ``vllm_common``, ``policy``): vLLM's two
  model runners, configured by ``additional_config={"memfree": {...}}``.
- :mod:`~memfree.engines.llama_cpp`: llama-cpp-python's ``logits_processor=``; it fails closed.

Operators name the public paths, which stay stable: ``memfree.processor``,
``memfree.integrations.vllm`` and ``memfree.integrations.llama_cpp``. No adapter imports its
engine at module level beyond the base class vLLM requires, so each is tested against replicas
of the engine's objects.
"""
