"""Sampling evaluation examples from a corpus: a k-token prompt and the m tokens that follow it
(Carlini et al., "Quantifying Memorization": discoverable memorization; the paper's defaults are
k = m = 50), optionally with how often the whole sequence occurs in the corpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Example:
    """One evaluation example cut from a corpus document."""

    example_id: str  # "<source>#<token offset>", stable across runs with the same seed
    source: str
    prompt_ids: tuple[int, ...]
    truth_ids: tuple[int, ...]
    occurrences: int | None = None  # times prompt+truth occurs in the corpus, when counted

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["prompt_ids"] = list(self.prompt_ids)
        data["truth_ids"] = list(self.truth_ids)
        return data


def skipped(problems: Any) -> str:
    """`` (where: why; ...)``: the first inputs a ``ProblemLog`` skipped, or nothing."""
    found = [example for examples in problems.examples.values() for example in examples]
    return f" ({'; '.join(found)})" if found else ""


def sample_examples(
    corpus: Sequence[str],
    tokenizer: Any,
    num_examples: int,
    prompt_tokens: int = 50,
    truth_tokens: int = 50,
    seed: int = 0,
    text_field: str = "text",
    count_occurrences: bool = False,
    *,
    required: bool = False,
) -> list[Example]:
    """Draw ``num_examples`` windows of ``prompt_tokens + truth_tokens`` tokens from a corpus.

    Documents are drawn uniformly (reservoir sampling over every readable document long enough
    by its characters), then one window at a uniform offset in each; documents too short once
    tokenized are replaced by the next drawn.

    Args:
        corpus: paths, directories, globs or ``stdlib:`` (as ``memfree build`` takes them).
        tokenizer: the model's tokenizer.
        num_examples: examples wanted (fewer if the corpus has fewer long documents).
        prompt_tokens: k, the prompt length in tokens.
        truth_tokens: m, the true continuation length in tokens.
        seed: random seed.
        text_field: JSONL field / Parquet column holding the text.
        count_occurrences: also count how often each window occurs in the corpus (a second
            pass; for the paper's frequency buckets).
        required: refuse to return fewer than ``num_examples`` examples (what the experiments
            do: their settings record the number asked for); without it, fewer may come back.

    Raises:
        ValueError: no readable input; with ``required``, fewer documents long enough than
            ``num_examples`` (the message says how many there are and what to change).
    """
    from bloom_builder.sources import ProblemLog, SourceOptions, discover

    if num_examples < 1 or prompt_tokens < 1 or truth_tokens < 1:
        raise ValueError("num_examples, prompt_tokens and truth_tokens must all be >= 1")
    options = SourceOptions(text_field=text_field)
    problems = ProblemLog()
    units = discover(list(corpus), options, problems)
    if not units:
        raise ValueError(f"no readable input in {', '.join(corpus)}{skipped(problems)}")
    rng = np.random.default_rng(seed)
    wanted = prompt_tokens + truth_tokens
    # A token holds at least one character: shorter documents cannot give a window.
    reservoir, seen = _reservoir(units, options, problems, rng, 4 * num_examples, wanted)
    examples = _windows(reservoir, tokenizer, rng, num_examples, prompt_tokens, truth_tokens)
    if required and len(examples) < num_examples:
        raise ValueError(
            _shortfall(corpus, num_examples, len(examples), len(reservoir), seen, wanted)
        )
    if count_occurrences and examples:
        counts = _count_occurrences(units, options, tokenizer, examples)
        examples = [
            Example(e.example_id, e.source, e.prompt_ids, e.truth_ids, counts[i])
            for i, e in enumerate(examples)
        ]
    return examples


def _reservoir(
    units: Any, options: Any, problems: Any, rng: np.random.Generator, pool: int, min_chars: int
) -> tuple[list[tuple[str, str]], int]:
    """A uniform draw (reservoir sampling) of up to ``pool`` (source, text) documents of at least
    ``min_chars`` characters, and how many such documents there were."""
    from bloom_builder.sources import documents_of

    reservoir: list[tuple[str, str]] = []
    seen = 0
    for found in documents_of(units, options, problems):
        if len(found.text) < min_chars:
            continue
        seen += 1
        item = (_source_name(found), found.text)
        if len(reservoir) < pool:
            reservoir.append(item)
        else:
            slot = int(rng.integers(0, seen))
            if slot < pool:
                reservoir[slot] = item
    return reservoir, seen


def _windows(
    reservoir: list[tuple[str, str]],
    tokenizer: Any,
    rng: np.random.Generator,
    num_examples: int,
    prompt_tokens: int,
    truth_tokens: int,
) -> list[Example]:
    """Up to ``num_examples`` examples, one window at a uniform offset of each drawn document
    (in a random order) that is long enough once tokenized."""
    wanted = prompt_tokens + truth_tokens
    order = rng.permutation(len(reservoir))
    examples: list[Example] = []
    for position in order:
        source, text = reservoir[int(position)]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < wanted:
            continue
        start = int(rng.integers(0, len(ids) - wanted + 1))
        window = ids[start : start + wanted]
        examples.append(
            Example(
                example_id=f"{source}#{start}",
                source=source,
                prompt_ids=tuple(window[:prompt_tokens]),
                truth_ids=tuple(window[prompt_tokens:]),
            )
        )
        if len(examples) == num_examples:
            break
    return examples


def _shortfall(
    corpus: Sequence[str], asked: int, found: int, drawn: int, seen: int, wanted: int
) -> str:
    """Why fewer examples than ``--num-examples`` were found, and what to change."""
    fix = "give a larger corpus, or shorten --prompt-tokens/--truth-tokens"
    if found:
        fix = f"ask for --num-examples {found} or fewer, {fix}"
    where = ", ".join(corpus)
    if drawn >= seen:  # every document long enough by its characters was tokenized
        held = f"only {found} document{'s' if found > 1 else ''}" if found else "no document"
        return (
            f"--num-examples {asked}: {where} holds {held} of at least {wanted} tokens (prompt "
            f"and truth), and each gives one example; {fix}"
        )
    return (
        f"--num-examples {asked}: only {found} of the {drawn} documents drawn from {where} are "
        f"{wanted} tokens long (prompt and truth), one example each; {fix}"
    )


def sample_bucketed_examples(
    corpus: Sequence[str],
    tokenizer: Any,
    per_bucket: int,
    prompt_tokens: int = 50,
    truth_tokens: int = 50,
    seed: int = 0,
    text_field: str = "text",
    max_tokens: int = 50_000_000,
) -> list[Example]:
    """Up to ``per_bucket`` examples from each repetition bucket (Carlini et al.'s and the MemFree
    paper's 2^(i/4) buckets of how often a sequence occurs in the corpus).

    One pass tokenizes the corpus (up to ``max_tokens`` tokens) and counts every window of
    ``prompt_tokens + truth_tokens`` tokens by its 64-bit fingerprint; windows are then drawn
    uniformly among the distinct windows of each bucket, so rare repeated sequences are found
    without sampling millions of candidates.
    """
    from bloom_builder.sources import ProblemLog, SourceOptions, iter_documents
    from memfree.filterfile.sliding import sliding_fingerprints_np

    if per_bucket < 1:
        raise ValueError(f"per_bucket must be >= 1, got {per_bucket}")
    width = prompt_tokens + truth_tokens
    options = SourceOptions(text_field=text_field)
    problems = ProblemLog()
    documents: list[tuple[str, np.ndarray]] = []
    fingerprints: list[np.ndarray] = []
    total = 0
    for found in iter_documents(list(corpus), options, problems):
        ids = np.asarray(tokenizer(found.text, add_special_tokens=False)["input_ids"])
        if ids.shape[0] < width:
            continue
        documents.append((_source_name(found), ids))
        fingerprints.append(sliding_fingerprints_np(ids, width))
        total += ids.shape[0]
        if total >= max_tokens:
            break
    if not documents:
        return []
    owners = np.concatenate([np.full(f.shape[0], i, np.int64) for i, f in enumerate(fingerprints)])
    offsets = np.concatenate([np.arange(f.shape[0]) for f in fingerprints])
    keys = np.concatenate(fingerprints)
    distinct, first, counts = np.unique(keys, return_index=True, return_counts=True)
    buckets = np.floor(4 * np.log2(counts) + 1e-9).astype(np.int64)
    rng = np.random.default_rng(seed)
    examples: list[Example] = []
    for bucket in np.unique(buckets):
        members = np.flatnonzero(buckets == bucket)
        chosen = rng.choice(members, size=min(per_bucket, members.size), replace=False)
        for member in sorted(chosen.tolist()):
            position = int(first[member])
            source, ids = documents[int(owners[position])]
            start = int(offsets[position])
            window = ids[start : start + width].tolist()
            examples.append(
                Example(
                    example_id=f"{source}#{start}",
                    source=source,
                    prompt_ids=tuple(window[:prompt_tokens]),
                    truth_ids=tuple(window[prompt_tokens:]),
                    occurrences=int(counts[member]),
                )
            )
    del distinct
    return examples


def _count_occurrences(
    units: Sequence[Any], options: Any, tokenizer: Any, examples: Sequence[Example]
) -> list[int]:
    """Occurrences of each example's full window in the corpus (by 64-bit fingerprint)."""
    from bloom_builder.sources import ProblemLog, documents_of
    from memfree.filterfile.hashing import fingerprints_np
    from memfree.filterfile.sliding import sliding_fingerprints_np

    width = len(examples[0].prompt_ids) + len(examples[0].truth_ids)
    windows = np.array([e.prompt_ids + e.truth_ids for e in examples], dtype=np.int64)
    # Several examples may be the same window (duplicated documents): count each distinct one.
    sorted_targets, inverse = np.unique(fingerprints_np(windows), return_inverse=True)
    counts = np.zeros(sorted_targets.size, dtype=np.int64)
    for document in documents_of(units, options, ProblemLog()):
        ids = np.asarray(tokenizer(document.text, add_special_tokens=False)["input_ids"])
        found = sliding_fingerprints_np(ids, width)
        if not found.size:
            continue
        where = np.searchsorted(sorted_targets, found)
        hit = where < sorted_targets.size
        hit[hit] = sorted_targets[where[hit]] == found[hit]
        np.add.at(counts, where[hit], 1)
    return [int(count) for count in counts[inverse.reshape(-1)]]


def _source_name(found: Any) -> str:
    """A name unique to one document of the corpus: the file path, plus where in it (a
    :class:`bloom_builder.sources.SourcedDocument`)."""
    unit, index = found.unit, found.index
    if unit.kind == "text" and unit.start == 0 and index == 0:
        return str(unit.path)
    return f"{unit.path}[{unit.kind} {unit.start}:{unit.stop}]:{index}"


def frequency_bucket(occurrences: int) -> int:
    """The paper's bucket of a repetition count: i such that 2^(i/4) <= count < 2^((i+1)/4)."""
    if occurrences < 1:
        raise ValueError(f"occurrences must be >= 1, got {occurrences}")
    return int(np.floor(4 * np.log2(occurrences) + 1e-9))
