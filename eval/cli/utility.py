"""``memfree eval utility``: how much ordinary text a filter would block (Ippolito et al. 2023,
Appendix B.4): the share of reference texts holding a stored n-gram, and of their n-grams."""

from __future__ import annotations

import argparse
import json
from typing import Any

from memfree.cli.common import fail


def run_utility_command(args: argparse.Namespace) -> int:
    """Run ``memfree eval utility``; returns the exit status (2 for bad options or inputs)."""
    if args.max_texts < 1:
        return fail(f"--max-texts must be >= 1, got {args.max_texts}")
    from eval.resultfiles import first_unreadable

    unreadable = first_unreadable(args.texts)
    if unreadable:
        return fail(unreadable)
    from memfree.errors import FilterError
    from memfree.vocab.tokenizer import TokenizerNotFoundError

    try:
        ngram_filter, tokenizer = _filter_and_tokenizer(args.filter, args.tokenizer)
    except (FileNotFoundError, FilterError, TokenizerNotFoundError) as error:
        return fail(str(error))
    texts, skipped_why = _read_texts(args.texts, args.text_field, args.max_texts)
    if not texts:
        return fail(f"no readable text in {', '.join(args.texts)}{skipped_why}")
    from eval.utility import run_utility

    try:
        result = run_utility(texts, tokenizer, ngram_filter)
    except FilterError as error:  # a damaged block or section, checked when first read
        return fail(_naming(str(args.filter), error))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
        return 0
    print(
        f"{result.texts_with_stored_ngram:,} of {result.texts:,} texts "
        f"({result.share_of_texts:.1%}) hold a stored {ngram_filter.n}-gram; "
        f"{result.stored_ngrams:,} of {result.ngrams:,} n-grams stored "
        f"({result.share_of_ngrams:.2%})"
    )
    for example in result.examples:
        print(f"  {example.first_stored_ngram!r} in {example.text[:80]!r}")
    return 0


def _naming(filter_path: str, error: Exception) -> str:
    """A filter's error as the user reads it, the file named first. The library's errors name
    it already, with the problem and the fix (``FILTER: section 3, block 0: checksum mismatch;
    the file is damaged ..., rebuild it with memfree build``)."""
    message = str(error)
    return message if filter_path in message else f"{filter_path}: {message}"


def _filter_and_tokenizer(filter_path: str, tokenizer_name: str | None) -> tuple[Any, Any]:
    """The filter and, for a token filter, the tokenizer its n-grams are counted in.

    A word filter's n-grams are those of the text's normalized words: it needs no tokenizer.

    Raises:
        FileNotFoundError, memfree.errors.FilterError: the filter is missing or damaged.
        memfree.errors.FilterMismatchError: the tokenizer is not the one the filter was built
            with (the guard's own check).
        memfree.vocab.tokenizer.TokenizerNotFoundError: no such tokenizer.
    """
    from memfree.filterfile import NgramFilter
    from memfree.units import unit_of
    from memfree.vocab.tokenizer import check_tokenizer, load_tokenizer

    ngram_filter = NgramFilter.open(filter_path)
    if not unit_of(ngram_filter).reads_token_ids:
        return ngram_filter, None  # a word filter reads text: no tokenizer to load
    tokenizer = load_tokenizer(tokenizer_name)
    check_tokenizer(ngram_filter, tokenizer)
    return ngram_filter, tokenizer


def _read_texts(paths: list[str], text_field: str, max_texts: int) -> tuple[list[str], str]:
    """Up to ``max_texts`` documents of ``paths``, and why inputs were skipped ("" if none)."""
    from bloom_builder.sources import ProblemLog, SourceOptions, iter_documents
    from eval.sampling import skipped

    problems = ProblemLog()
    texts: list[str] = []
    for found in iter_documents(paths, SourceOptions(text_field=text_field), problems):
        texts.append(found.text)
        if len(texts) >= max_texts:
            break
    return texts, skipped(problems)
