"""The bytes each vocabulary token adds to decoded text, read from the tokenizer's decoder.

The word guard reasons about text, so it needs, for every token id, the exact bytes the token
appends when a sequence is decoded: concatenating them gives ``tokenizer.decode(ids)`` up to a
leading space, which changes no word (the one a SentencePiece decoder strips at the start, or the
one that starts a space-joined text).

Supported decoders (Hugging Face ``tokenizers``): ``ByteLevel`` (GPT-2, Llama 3, SmolLM),
``Metaspace`` and the SentencePiece sequence ``Replace("▁", " ")`` + ``ByteFallback`` (Llama 2,
Mistral, Gemma), ``WordPiece`` (BERT; its per-token ``cleanup`` too), ``BPEDecoder``
(suffix-marked BPE), and no decoder: ``tokenizers`` then joins the tokens with one space (a
``WordLevel`` model's words), so each token appends a space and its text.

transformers' ``clean_up_tokenization_spaces`` rewrites the *whole* decoded text with rules that
chain across tokens and change words (``"fox n ' t"`` becomes ``"foxn't"``, gluing words):
no table of token bytes models that, so a tokenizer whose ``decode`` applies it is refused (set
``clean_up_tokenization_spaces=False``, or use the token unit).
"""

from __future__ import annotations

import json
import re
from typing import Any

from memfree.errors import UnsupportedTokenizerError
from memfree.vocab.specials import special_token_ids

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_chars() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (how ``ByteLevel`` spells tokens)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {byte: chr(character) for byte, character in zip(printable, characters, strict=True)}


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted."""
    return {character: byte for byte, character in byte_level_chars().items()}


def _step(spec: dict[str, Any]) -> Any:
    """One decoder step as a function (token: bytes | str) -> bytes | str, or None to ignore."""
    kind = spec.get("type")
    if kind == "ByteLevel":
        table = _byte_level_decoder()

        def byte_level(token: bytes | str) -> bytes | str:
            if isinstance(token, bytes) or any(char not in table for char in token):
                return token  # an added token: its text, as written
            return bytes(table[char] for char in token)

        return byte_level
    if kind == "Replace":
        pattern = spec.get("pattern", {})
        if "String" not in pattern:
            raise UnsupportedTokenizerError(f"a Replace decoder with a regex pattern: {spec}")
        old, new = pattern["String"], spec.get("content", "")
        return lambda token: token.replace(old, new) if isinstance(token, str) else token
    if kind == "ByteFallback":

        def byte_fallback(token: bytes | str) -> bytes | str:
            if isinstance(token, str):
                match = _BYTE_FALLBACK.fullmatch(token)
                if match:
                    return bytes([int(match.group(1), 16)])
            return token

        return byte_fallback
    if kind == "Metaspace":
        replacement = spec.get("replacement", "▁")
        return lambda token: token.replace(replacement, " ") if isinstance(token, str) else token
    if kind == "WordPiece":
        prefix = spec.get("prefix", "##")
        cleanup = bool(spec.get("cleanup", True))

        def word_piece(token: bytes | str) -> bytes | str:
            if isinstance(token, bytes):
                return token
            text = token[len(prefix) :] if token.startswith(prefix) else " " + token
            # tokenizers cleans each token's text on its own (its `cleanup`), so a table is exact.
            return _wordpiece_cleanup(text) if cleanup else text

        return word_piece
    if kind == "BPEDecoder":
        suffix = spec.get("suffix", "</w>")
        return lambda token: token.replace(suffix, " ") if isinstance(token, str) else token
    if kind in ("Fuse", "Strip"):
        return None  # joins tokens / trims the start of the whole text: no change to words
    raise UnsupportedTokenizerError(f"decoder type {kind!r}")


# tokenizers' decoders::wordpiece::cleanup, rule for rule and in its order (applied to each token).
_WORDPIECE_CLEANUP_RULES = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" do not", " don't"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def _wordpiece_cleanup(text: str) -> str:
    for old, new in _WORDPIECE_CLEANUP_RULES:
        text = text.replace(old, new)
    return text


def _space_joined(token: bytes | str) -> bytes | str:
    """No decoder: ``tokenizers`` joins the tokens with one space (``tokens.join(" ")``)."""
    return b" " + token if isinstance(token, bytes) else " " + token


def text_cleanup(tokenizer: Any) -> bool:
    """Whether ``tokenizer.decode`` (transformers, default arguments) cleans up the decoded
    text's spaces: its ``clean_up_tokenization_spaces``, which transformers ignores for a BPE
    model unless told to apply it anyway."""
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = type(getattr(backend, "model", None)).__name__
    forced = getattr(
        tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False
    )
    return model != "BPE" or bool(forced)


def _steps(spec: dict[str, Any] | None) -> list[Any]:
    if spec is None:
        return []
    if spec.get("type") == "Sequence":
        return [step for inner in spec.get("decoders", []) for step in _steps(inner)]
    step = _step(spec)
    return [] if step is None else [step]


def token_bytes(tokenizer: Any, vocab_size: int | None = None) -> list[bytes | None]:
    """The bytes each token id appends to decoded text; None for special tokens (no text).

    Args:
        tokenizer: a Hugging Face fast tokenizer.
        vocab_size: how many ids (default ``len(tokenizer)``); ids the tokenizer does not know
            (a model's padded embedding rows) decode to nothing and get ``b""``.

    Raises:
        UnsupportedTokenizerError: a slow tokenizer, or a decoder memfree cannot read exactly.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if backend is None:
        raise UnsupportedTokenizerError(
            f"tokenizer {name!r} is a slow (Python) tokenizer; the word guard reads token bytes "
            "from a fast tokenizer's decoder: load it with use_fast=True"
        )
    decoder = json.loads(backend.to_str()).get("decoder")
    try:
        steps = _steps(decoder)
    except UnsupportedTokenizerError as error:
        raise UnsupportedTokenizerError(
            f"tokenizer {name!r}: the word guard cannot read token bytes from {error}; "
            "supported: ByteLevel, Metaspace, SentencePiece byte fallback, WordPiece, BPEDecoder, "
            "or no decoder; use the token unit (`memfree build --unit token`) for this tokenizer"
        ) from None
    if text_cleanup(tokenizer):
        raise UnsupportedTokenizerError(
            f"tokenizer {name!r}: its decode() cleans up spaces over the whole decoded text "
            "(clean_up_tokenization_spaces=True), with rules that join words across tokens "
            '("fox n \' t" becomes "foxn\'t"): the word guard cannot read that text from token '
            "bytes. Set tokenizer.clean_up_tokenization_spaces = False (or save the tokenizer "
            "with it), or use the token unit (`memfree build --unit token`)"
        )
    if decoder is None:
        steps = [_space_joined]
    size = len(tokenizer) if vocab_size is None else int(vocab_size)
    special = set(special_token_ids(tokenizer))
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(size, len(tokenizer)))))
    table: list[bytes | None] = []
    for token_id in range(size):
        if token_id in special:
            table.append(None)
            continue
        piece = pieces[token_id] if token_id < len(pieces) else None
        if piece is None:
            table.append(b"")
            continue
        value: bytes | str = piece
        for step in steps:
            value = step(value)
        table.append(value if isinstance(value, bytes) else value.encode("utf-8"))
    return table


def byte_fallback_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of ``<0xNN>`` byte tokens when the decoder has a ``ByteFallback`` step, else empty.

    ``tokenizers`` decodes a run of consecutive byte tokens as one UTF-8 string when it is valid,
    and as one U+FFFD per token when it is not; the word guard reads such runs the same way.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or '"ByteFallback"' not in backend.to_str():
        return frozenset()
    vocab = tokenizer.get_vocab()
    return frozenset(i for piece, i in vocab.items() if _BYTE_FALLBACK.fullmatch(piece))


__all__ = [
    "UnsupportedTokenizerError",
    "byte_fallback_ids",
    "byte_level_chars",
    "text_cleanup",
    "token_bytes",
]
