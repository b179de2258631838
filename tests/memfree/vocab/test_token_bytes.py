"""Token bytes of tokenizers without a byte-level decoder: a tokenizer with no decoder (``tokenizers``
joins its tokens with one space) read as it decodes, a word guard over it, WordPiece's clean-up
read token by token, and a tokenizer that cleans up decoded text refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree import NgramFilter
from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.filterfile.protocol import NgramSet
from memfree.vocab.token_bytes import UnsupportedTokenizerError, token_bytes
from memfree.vocab.words import words

SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

# ------------------------------------------------------------------------------------------------
# 3. A tokenizer with no decoder: `tokenizers` joins its tokens with one space.

FIVE_WORDS = ["the", "quick", "brown", "fox", "jumps"]


def word_level(clean_up: bool = False, decoder: Any = None, extra: tuple[str, ...] = ()) -> Any:
    """A real WordLevel tokenizer over FIVE_WORDS (and ``extra``), wrapped as transformers does."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate([*FIVE_WORDS, *extra, "[UNK]"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_tokens([AddedToken("over the", normalized=False)])  # an added token with a space
    if decoder is not None:
        backend.decoder = decoder
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        eos_token="[UNK]",
        clean_up_tokenization_spaces=clean_up,
    )


@pytest.fixture(scope="module")
def five_word_filter(tmp_path_factory: pytest.TempPathFactory) -> NgramSet:
    """A real word 3-gram filter of "the quick brown fox jumps", built by the builder (the
    default layout: the word index)."""
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings

    directory = tmp_path_factory.mktemp("five-words")
    corpus = directory / "corpus.txt"
    corpus.write_text(" ".join(FIVE_WORDS) + "\n", encoding="utf-8")
    output = directory / "words.memfree"
    build_filter(
        [str(corpus)],
        output,
        # 1e-7: the three-record index's remainder (25 bits) is wide enough that no other
        # prefix of these tests collides with a stored one (at 1e-5, 18 bits, rarely one would;
        # 1e-9 is out of reach: three records tell little of how common their next words are).
        BuildSettings(ngram_size=3, unit="word", workers=1, false_positive_rate=1e-7),
        progress=False,
    )
    filt = NgramFilter.open(output)
    assert filt.layout == "prefix-index-v1" and filt.unit == "word" and filt.n == 3
    return filt


def banned_words(guard: Any, tok: Any, context: str) -> set[str]:
    ids = torch.tensor([tok(context, add_special_tokens=False)["input_ids"]])
    out = guard(ids, torch.zeros(1, len(tok)))
    return set(tok.convert_ids_to_tokens(torch.isneginf(out[0]).nonzero().flatten().tolist()))


def test_word_guard_over_a_tokenizer_without_decoder_bans_the_stored_word(
    five_word_filter: NgramSet,
) -> None:
    """The issue's case: context "the quick" must ban "brown" (before: nothing banned, as the
    guard read the row as "thequick")."""
    tok = word_level()
    assert tok.backend_tokenizer.decoder is None
    assert tok.decode(tok("the quick brown")["input_ids"]) == "the quick brown"
    guard = MemFreeLogitsProcessor(five_word_filter, tokenizer=tok)
    assert banned_words(guard, tok, "the quick") == {"brown"}
    assert banned_words(guard, tok, "quick brown") == {"fox"}
    assert banned_words(guard, tok, "brown fox") == {"jumps"}
    assert banned_words(guard, tok, "the brown") == set()  # (the brown x) begins nothing


def test_guarded_generation_over_a_wordlevel_tokenizer_emits_no_stored_ngram(
    five_word_filter: NgramSet, scripted_lm: Any
) -> None:
    """A model that insists on "the quick brown fox jumps", guarded through generate()."""
    from memfree.units import get_unit

    tok = word_level()
    ids = [tok.convert_tokens_to_ids(word) for word in FIVE_WORDS]
    stored = [ids[i : i + 3] for i in range(3)]
    model = scripted_lm(len(tok), stored, boost=50.0, eos=tok.eos_token_id)
    guard = MemFreeLogitsProcessor(five_word_filter, tokenizer=tok)
    prompt = torch.tensor([ids[:2]])
    options = dict(attention_mask=torch.ones_like(prompt), do_sample=False, use_cache=False)
    out = model.generate(prompt, logits_processor=[guard], max_new_tokens=4, **options)
    new = out[0, 2:].tolist()
    found, _ = get_unit("word").created_ngram_counts(five_word_filter, ids[:2], new, tokenizer=tok)
    assert found == 0 and new[0] != ids[2]
    plain = model.generate(prompt, max_new_tokens=3, **options)
    assert plain[0, 2].item() == ids[2]  # unguarded, the model does emit "brown"


@settings(max_examples=80, deadline=None, suppress_health_check=SLOW)
@given(ids=st.lists(st.integers(0, 9), max_size=12))
def test_token_bytes_of_a_tokenizer_without_decoder_read_as_it_decodes(ids: list[int]) -> None:
    """The guard's reading of a row (its tokens' bytes, joined) has the words of ``decode``."""
    tok = _no_decoder_tokenizer()
    table = token_bytes(tok)
    ids = [i for i in ids if i < len(tok)]
    joined = b"".join(table[i] or b"" for i in ids).decode("utf-8")
    assert words(joined) == words(tok.decode(ids, skip_special_tokens=True))


_CACHE: dict[str, Any] = {}


def _no_decoder_tokenizer() -> Any:
    if "tok" not in _CACHE:
        _CACHE["tok"] = word_level(extra=("n't", "'", "do", "not"))
    return _CACHE["tok"]


@settings(max_examples=80, deadline=None, suppress_health_check=SLOW)
@given(ids=st.lists(st.integers(0, 10), max_size=12))
def test_wordpiece_cleanup_is_read_token_by_token_as_tokenizers_does(ids: list[int]) -> None:
    """tokenizers' WordPiece decoder cleans each token up on its own (`" n't"` -> `"n't"`, gluing
    it to the word before): the table does the same (before: "do n't" read as do n t)."""
    from tokenizers import decoders

    if "wordpiece" not in _CACHE:
        _CACHE["wordpiece"] = word_level(
            decoder=decoders.WordPiece(cleanup=True), extra=("n't", "'", "do", "not", "##s")
        )
    tok = _CACHE["wordpiece"]
    table = token_bytes(tok)
    ids = [i for i in ids if i < len(tok)]
    joined = b"".join(table[i] or b"" for i in ids).decode("utf-8")
    assert words(joined) == words(tok.decode(ids, skip_special_tokens=True))
    do, nt = tok.convert_tokens_to_ids(["do", "n't"])
    assert words(b"".join([table[do] or b"", table[nt] or b""]).decode()) == ["don", "t"]


@pytest.mark.parametrize("decoder", [None, "wordpiece"])
def test_a_tokenizer_that_cleans_up_decoded_text_is_refused_by_name(
    five_word_filter: NgramSet, decoder: str | None
) -> None:
    """transformers' clean-up chains across tokens ("fox n ' t" -> "foxn't"): not modelled."""
    from tokenizers import decoders

    tok = word_level(
        clean_up=True,
        decoder=decoders.WordPiece(cleanup=False) if decoder else None,
        extra=("n", "'", "t"),
    )
    fox, n, quote, t = tok.convert_tokens_to_ids(["fox", "n", "'", "t"])
    assert words(tok.decode([fox, n, quote, t])) == ["foxn", "t"]  # words of no token
    with pytest.raises(UnsupportedTokenizerError, match="clean_up_tokenization_spaces") as error:
        MemFreeLogitsProcessor(five_word_filter, tokenizer=tok)
    assert "--unit token" in str(error.value)
    tok.clean_up_tokenization_spaces = False  # the fix the message names
    MemFreeLogitsProcessor(five_word_filter, tokenizer=tok)
