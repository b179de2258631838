"""The serving engines' public import paths, kept stable: operators put them in server flags.

- ``memfree.integrations.vllm:MemFreeV1LogitsProcessor`` / ``MemFreeV2LogitsProcessor``
- ``memfree.integrations.llama_cpp:MemFreeLlamaCppLogitsProcessor``

The adapters themselves live in :mod:`memfree.engines`.
"""
