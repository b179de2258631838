"""What the guard needs to know about a tokenizer, read once (after xgrammar's ``TokenizerInfo``).

The adapters (transformers, vLLM, llama.cpp), the CLI, the builder and eval hold a Hugging Face
tokenizer; everything below them — the units, the maskers, the counts of stored n-grams — takes a
:class:`TokenizerInfo` built from it at the seam, with :meth:`TokenizerInfo.of`. It answers the
ids (end of sequence, padding, specials), the vocabulary's size, its fingerprint, and each
token's bytes, each derived in one place; and it decodes and encodes for the counts that read
text. What is costly (the fingerprint hashes the whole vocabulary; the bytes table reads the
decoder) is computed on first use and kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from memfree.vocab.specials import special_token_ids, tokenizer_fingerprint


@dataclass(frozen=True, eq=False)
class TokenizerInfo:
    """A tokenizer, as memfree reads it.

    Attributes:
        name: a readable name (``name_or_path``, else the class name), for messages.
        vocab_size: ids the tokenizer can produce (base vocabulary plus added tokens).
        eos_token_id: its end-of-sequence id, or None.
        pad_token_id: its padding id, or None.
        special_token_ids: its special tokens' ids (end of sequence, padding, chat markers, added
            special tokens), sorted and distinct: no stored n-gram holds one (the builder cuts
            sequences at them), and the guard never bans one.
    """

    name: str
    vocab_size: int
    eos_token_id: int | None
    pad_token_id: int | None
    special_token_ids: tuple[int, ...]
    tokenizer: Any = field(repr=False)  # the adapter's tokenizer (decode, encode, tables)

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerInfo:
        """The info of a Hugging Face tokenizer (an info is returned as it is).

        Raises:
            TypeError: None, or something with no vocabulary.
        """
        if isinstance(tokenizer, TokenizerInfo):
            return tokenizer
        if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
            raise TypeError(
                "tokenizer must be a Hugging Face tokenizer (with get_vocab()), got "
                f"{type(tokenizer).__name__}"
            )
        return cls(
            name=str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
            vocab_size=len(tokenizer),
            eos_token_id=_token_id(getattr(tokenizer, "eos_token_id", None)),
            pad_token_id=_token_id(getattr(tokenizer, "pad_token_id", None)),
            special_token_ids=special_token_ids(tokenizer),
            tokenizer=tokenizer,
        )

    @cached_property
    def fingerprint(self) -> str:
        """xxh3-64 of the vocabulary and special tokens (:func:`tokenizer_fingerprint`),
        computed once."""
        return tokenizer_fingerprint(self.tokenizer)

    @cached_property
    def token_bytes(self) -> tuple[bytes | None, ...]:
        """The bytes each id below :attr:`vocab_size` appends to decoded text; None for special
        tokens (see :func:`memfree.vocab.token_bytes.token_bytes`).

        Raises:
            UnsupportedTokenizerError: a slow tokenizer, or a decoder memfree cannot read exactly.
        """
        from memfree.vocab.token_bytes import token_bytes

        return tuple(token_bytes(self.tokenizer))

    @cached_property
    def byte_fallback_ids(self) -> frozenset[int]:
        """Ids of ``<0xNN>`` byte tokens when the decoder falls back to bytes, else empty."""
        from memfree.vocab.token_bytes import byte_fallback_ids

        return byte_fallback_ids(self.tokenizer)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids``, as the tokenizer's ``decode`` gives it."""
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, tokenized with no special tokens added."""
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]


def _token_id(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = ["TokenizerInfo"]
