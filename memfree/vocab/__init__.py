"""What a vocabulary means to memfree: tokenizer loading and fingerprint
(:mod:`~memfree.vocab.tokenizer`), the bytes each token adds to text
(:mod:`~memfree.vocab.token_bytes`), the versioned word normalizer (:mod:`~memfree.vocab.words`),
and :class:`~memfree.vocab.info.TokenizerInfo`, built once from a tokenizer.
"""
