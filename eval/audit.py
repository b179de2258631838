"""The audit: how exposed planted canaries are, and whether they can be extracted, with and without
the guard (Secret Sharer; Quantifying Memorization; Jagielski's note on interpreting exposure).
Everything starts from a manifest written by :func:`eval.canaries.insert_canaries`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from eval.audit_results import (
    CanaryExposure,
    CanaryExtraction,
    ExposureGroup,
    ExposureResult,
    ExtractabilityResult,
    ExtractableSequence,
    ExtractableShare,
    ExtractionResult,
    ShortestPathSearch,
    audit_settings,
)
from eval.canary_formats import Canary, CanaryFormat
from eval.exposure import (
    epsilon_lower_bound,
    extrapolated_exposure,
    rank_exposure,
)
from eval.extraction import greedy_extract, log_perplexities, shortest_path_extract

EXACT_SPACE_LIMIT = 100_000


def reference_texts(
    canary_format: CanaryFormat, canaries: list[Canary], count: int, seed: int
) -> tuple[list[str], int, bool]:
    """Reference sequences: all of R but the canaries when small enough, else a uniform sample.

    Returns:
        (texts, |R|, exact).
    """
    planted = {canary.secret for canary in canaries}
    size = canary_format.space_size
    if size <= min(count, EXACT_SPACE_LIMIT):
        secrets = [s for s in canary_format.all_secrets() if s not in planted]
        return [canary_format.fill(list(s)) for s in secrets], size, True
    rng = np.random.default_rng(seed)
    secrets = [
        s for s in canary_format.random_secrets(count + len(planted), rng) if s not in planted
    ]
    return [canary_format.fill(list(s)) for s in secrets[:count]], size, False


def run_exposure(
    model: Any,
    tokenizer: Any,
    canary_format: CanaryFormat,
    canaries: list[Canary],
    guard: Any = None,
    references: int = 10_000,
    seed: int = 0,
    batch_size: int = 256,
) -> ExposureResult:
    """Exposure of every canary (secret part given the prefix), by rank and by extrapolation."""
    texts, size, exact = reference_texts(canary_format, canaries, references, seed)
    prefix = canary_format.prefix
    import sys

    from tqdm import tqdm

    with tqdm(
        total=len(texts), desc="scoring references", unit="seq", file=sys.stderr, leave=False
    ) as bar:
        _, reference_scores = log_perplexities(
            model, tokenizer, texts, prefix, guard, batch_size, progress=bar.update
        )
    whole, secret = log_perplexities(
        model, tokenizer, [c.text for c in canaries], prefix, guard, batch_size
    )
    finite = reference_scores[np.isfinite(reference_scores)]
    ranked = np.atleast_1d(rank_exposure(secret, reference_scores, space_size=size))
    extrapolated = extrapolated_exposure(secret, finite) if finite.size >= 10 else None
    rows = tuple(
        CanaryExposure(
            canary=canary.text,
            repetitions=canary.repetitions,
            log_perplexity=float(whole[index]),
            secret_log_perplexity=float(secret[index]),
            rank_exposure=float(ranked[index]),
            extrapolated_exposure=None
            if extrapolated is None
            else float(np.atleast_1d(extrapolated)[index]),
        )
        for index, canary in enumerate(canaries)
    )
    groups = _exposure_groups(canaries, ranked)
    settings, signature = audit_settings(
        model,
        guard,
        step="exposure",
        canary_format=canary_format.template,
        space_size=size,
        canaries=len(canaries),
        references=references,
        seed=seed,
    )
    return ExposureResult(
        size, len(texts), exact, guard is not None, rows, groups, settings, signature
    )


def _exposure_groups(canaries: list[Canary], ranked: np.ndarray) -> tuple[ExposureGroup, ...]:
    """The canaries' rank exposures grouped by their repetitions: median, 10%-90% and ε bound."""
    by_repetitions: dict[int, list[float]] = defaultdict(list)
    for canary, exposure in zip(canaries, ranked, strict=True):
        by_repetitions[canary.repetitions].append(float(exposure))
    return tuple(
        ExposureGroup(
            repetitions=repetitions,
            canaries=len(values),
            median_exposure=float(np.median(values)),
            quantiles_10_90=(float(np.quantile(values, 0.1)), float(np.quantile(values, 0.9))),
            epsilon_lower_bound=epsilon_lower_bound(float(np.median(values)), repetitions),
        )
        for repetitions, values in sorted(by_repetitions.items())
    )


def run_extraction(
    model: Any,
    tokenizer: Any,
    canary_format: CanaryFormat,
    canaries: list[Canary],
    guard: Any = None,
    max_queries: int = 100_000,
) -> ExtractionResult:
    """Greedy extraction of each canary from its prefix, and one shortest-path search."""
    rows = []
    for canary in canaries:
        secret = canary_format.secret_text(list(canary.secret))
        greedy = greedy_extract(model, tokenizer, canary_format.prefix, secret, guard)
        rows.append(
            CanaryExtraction(canary.text, canary.repetitions, greedy.recovered, greedy.guess)
        )
    search = shortest_path_extract(model, tokenizer, canary_format, guard, max_queries)
    secrets = {canary_format.secret_text(list(c.secret)): c for c in canaries}
    found = secrets.get(search.guess)
    settings, signature = audit_settings(
        model,
        guard,
        step="extraction",
        canary_format=canary_format.template,
        space_size=canary_format.space_size,
        canaries=len(canaries),
        max_queries=max_queries,
    )
    return ExtractionResult(
        guarded=guard is not None,
        space_size=canary_format.space_size,
        canaries=tuple(rows),
        shortest_path=ShortestPathSearch(
            guess=search.guess,
            recovered_canary=found.text if found else None,
            recovered_repetitions=found.repetitions if found else None,
            queries=search.queries,
            brute_force_queries=canary_format.space_size,
        ),
        settings=settings,
        signature=signature,
    )


def run_extractability(
    model: Any,
    tokenizer: Any,
    corpus: list[str],
    prompt_lengths: list[int],
    truth_tokens: int = 50,
    guard: Any = None,
    num_examples: int = 50,
    per_bucket: int | None = None,
    seed: int = 0,
    batch_size: int = 8,
) -> ExtractabilityResult:
    """k-extractability (Carlini et al. 2022, Definition 3.1) of corpus sequences.

    For each prompt length k, sequences of the corpus are cut into a k-token prompt and the next
    ``truth_tokens`` tokens; a sequence is extractable when greedy decoding from the prompt
    reproduces those tokens exactly. Reported by k and, with ``per_bucket``, by how often the
    sequence occurs in the corpus; run it once without and once with the guard.
    """
    from eval.metrics import exact_match
    from eval.sampling import frequency_bucket, sample_bucketed_examples, sample_examples
    from memfree.generation import DecodingSettings, complete

    rows: list[ExtractableSequence] = []
    decoding = DecodingSettings(max_new_tokens=truth_tokens, batch_size=batch_size)
    # Every k's sequences are drawn before any is generated: a corpus too small for one k is
    # refused before the work, not after.
    drawn = {
        k: sample_bucketed_examples(corpus, tokenizer, per_bucket, k, truth_tokens, seed)
        if per_bucket is not None
        else sample_examples(corpus, tokenizer, num_examples, k, truth_tokens, seed, required=True)
        for k in prompt_lengths
    }
    for k, examples in drawn.items():
        completions = complete(
            model,
            tokenizer,
            [list(e.prompt_ids) for e in examples],
            decoding,
            guard,
            count_stored=False,  # extractability reads the outputs only
        )
        rows += [
            ExtractableSequence(
                k=k,
                example_id=example.example_id,
                occurrences=example.occurrences,
                bucket=frequency_bucket(example.occurrences) if example.occurrences else None,
                extractable=exact_match(completion.output_ids, example.truth_ids),
            )
            for example, completion in zip(examples, completions, strict=True)
        ]
    by_k, by_bucket = _shares(rows, prompt_lengths)
    settings, signature = audit_settings(
        model,
        guard,
        step="extractability",
        corpus=list(corpus),
        prompt_lengths=list(prompt_lengths),
        truth_tokens=truth_tokens,
        num_examples=num_examples,
        per_bucket=per_bucket,
        seed=seed,
    )
    return ExtractabilityResult(
        guard is not None, truth_tokens, by_k, by_bucket, tuple(rows), settings, signature
    )


def _shares(
    rows: list[ExtractableSequence], prompt_lengths: list[int]
) -> tuple[tuple[ExtractableShare, ...], tuple[ExtractableShare, ...]]:
    """The share of extractable sequences by prompt length, and by repetition bucket."""
    by_k = tuple(
        ExtractableShare(len(members), _share(members), k=k)
        for k in prompt_lengths
        for members in [[row for row in rows if row.k == k]]
    )
    by_bucket = tuple(
        ExtractableShare(len(members), _share(members), bucket=bucket)
        for bucket in sorted({row.bucket for row in rows if row.bucket is not None})
        for members in [[row for row in rows if row.bucket == bucket]]
    )
    return by_k, by_bucket


def _share(members: list[ExtractableSequence]) -> float:
    return sum(row.extractable for row in members) / max(len(members), 1)
