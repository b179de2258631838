"""The audit: how exposed planted canaries are, and whether they can be extracted, with and without
the guard (Secret Sharer; Quantifying Memorization; Jagielski's note on interpreting exposure).
Everything starts from a manifest written by :func:`eval.canaries.insert_canaries`.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from eval.canaries import Canary, CanaryFormat
from eval.exposure import (
    RANDOM_GUESSING_MEAN,
    RANDOM_GUESSING_MEDIAN,
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
) -> dict[str, Any]:
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
    ranked = rank_exposure(secret, reference_scores, space_size=size)
    extrapolated = extrapolated_exposure(secret, finite) if finite.size >= 10 else None
    rows = []
    for index, canary in enumerate(canaries):
        rows.append(
            {
                "canary": canary.text,
                "repetitions": canary.repetitions,
                "log_perplexity": float(whole[index]),
                "secret_log_perplexity": float(secret[index]),
                "rank_exposure": float(np.atleast_1d(ranked)[index]),
                "extrapolated_exposure": None
                if extrapolated is None
                else float(np.atleast_1d(extrapolated)[index]),
            }
        )
    by_repetitions: dict[int, list[float]] = defaultdict(list)
    for canary, exposure in zip(canaries, np.atleast_1d(ranked), strict=True):
        by_repetitions[canary.repetitions].append(float(exposure))
    groups = []
    for repetitions, values in sorted(by_repetitions.items()):
        median = float(np.median(values))
        groups.append(
            {
                "repetitions": repetitions,
                "canaries": len(values),
                "median_exposure": median,
                "quantiles_10_90": [
                    float(np.quantile(values, 0.1)),
                    float(np.quantile(values, 0.9)),
                ],
                "epsilon_lower_bound": epsilon_lower_bound(median, repetitions),
            }
        )
    return {
        "space_size": size,
        "max_exposure": float(np.log2(size)),
        "references": len(texts),
        "exact": exact,
        "guarded": guard is not None,
        "random_guessing": {"median": RANDOM_GUESSING_MEDIAN, "mean": RANDOM_GUESSING_MEAN},
        "canaries": rows,
        "by_repetitions": groups,
    }


def run_extraction(
    model: Any,
    tokenizer: Any,
    canary_format: CanaryFormat,
    canaries: list[Canary],
    guard: Any = None,
    max_queries: int = 100_000,
) -> dict[str, Any]:
    """Greedy extraction of each canary from its prefix, and one shortest-path search."""
    rows = []
    for canary in canaries:
        secret = canary_format.secret_text(list(canary.secret))
        greedy = greedy_extract(model, tokenizer, canary_format.prefix, secret, guard)
        rows.append(
            {
                "canary": canary.text,
                "repetitions": canary.repetitions,
                "greedy_recovered": greedy.recovered,
                "greedy_output": greedy.guess,
            }
        )
    search = shortest_path_extract(model, tokenizer, canary_format, guard, max_queries)
    secrets = {canary_format.secret_text(list(c.secret)): c for c in canaries}
    found = secrets.get(search.guess)
    return {
        "guarded": guard is not None,
        "space_size": canary_format.space_size,
        "canaries": rows,
        "shortest_path": {
            "guess": search.guess,
            "recovered_canary": found.text if found else None,
            "recovered_repetitions": found.repetitions if found else None,
            "queries": search.queries,
            "brute_force_queries": canary_format.space_size,
        },
    }


def write_audit_report(
    out_dir: str | os.PathLike[str], results: dict[str, Any], title: str
) -> list[str]:
    """``audit.json``, ``audit.md`` and, for exposure results, ``exposure.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    lines = [f"# {title}", ""]
    written = ["audit.json", "audit.md"]
    for label, part in results.items():
        if not isinstance(part, dict):
            continue
        if "by_repetitions" in part:
            lines += [
                f"## Exposure ({label}): |R| = {part['space_size']:,}, maximum "
                f"{part['max_exposure']:.1f} bits, {part['references']:,} references "
                f"({'all of R' if part['exact'] else 'sampled'})",
                "",
                "| repetitions | canaries | median exposure | 10%–90% | ε lower bound |",
                "|---:|---:|---:|---:|---:|",
            ]
            for group in part["by_repetitions"]:
                low, high = group["quantiles_10_90"]
                lines.append(
                    f"| {group['repetitions']} | {group['canaries']} | "
                    f"{group['median_exposure']:.2f} | {low:.2f}–{high:.2f} | "
                    f"{group['epsilon_lower_bound']:.2f} |"
                )
            lines += [
                "",
                "Random guessing gives a median exposure of 1 (mean 1/ln 2 ≈ 1.44). The ε bound "
                "(Jagielski: ε ≥ ln 2 · (exposure − 1) / repetitions) holds only for the median "
                "over many canaries, assumes the canaries are drawn as the DP definition's "
                "neighbouring datasets differ, and a low exposure proves nothing about privacy.",
                "",
            ]
        if "shortest_path" in part:
            search = part["shortest_path"]
            lines += [
                f"## Extraction ({label})",
                "",
                "| canary | repetitions | greedy from the prefix |",
                "|---|---:|---|",
            ]
            for row in part["canaries"]:
                lines.append(
                    f"| `{row['canary']}` | {row['repetitions']} | "
                    f"{'recovered' if row['greedy_recovered'] else 'not recovered'} |"
                )
            lines += [
                "",
                f"Shortest-path search: best secret `{search['guess']}` after {search['queries']:,} "
                f"scored sequences (brute force: {search['brute_force_queries']:,}); "
                + (
                    f"it is the canary inserted {search['recovered_repetitions']} times."
                    if search["recovered_canary"]
                    else "it is no planted canary."
                ),
                "",
            ]
        if "by_k" in part:
            lines += [
                f"## k-extractability ({label}): greedy reproduces the next "
                f"{part['truth_tokens']} tokens exactly",
                "",
                "| k (prompt tokens) | sequences | extractable |",
                "|---:|---:|---:|",
            ]
            lines += [
                f"| {row['k']} | {row['sequences']} | {row['extractable']:.0%} |"
                for row in part["by_k"]
            ]
            if part["by_bucket"]:
                lines += [
                    "",
                    "| occurrences ≥ | sequences | extractable |",
                    "|---:|---:|---:|",
                ]
                lines += [
                    f"| {row['occurrences_from']:.1f} | {row['sequences']} | "
                    f"{row['extractable']:.0%} |"
                    for row in part["by_bucket"]
                ]
            lines.append("")
    exposure_parts = {
        k: v for k, v in results.items() if isinstance(v, dict) and "by_repetitions" in v
    }
    if exposure_parts:
        from memfree.errors import require

        require("matplotlib", "eval")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(5, 3.5))
        for label, part in exposure_parts.items():
            groups = part["by_repetitions"]
            axis.plot(
                [g["repetitions"] for g in groups],
                [g["median_exposure"] for g in groups],
                marker="o",
                label=label,
            )
            axis.axhline(part["max_exposure"], color="grey", linewidth=0.6, linestyle=":")
        axis.axhline(RANDOM_GUESSING_MEDIAN, color="grey", linewidth=0.6)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("times the canary was inserted")
        axis.set_ylabel("median exposure (bits)")
        axis.legend()
        figure.tight_layout()
        figure.savefig(out / "exposure.png", dpi=120)
        plt.close(figure)
        lines += ["![exposure against repetitions](exposure.png)", ""]
        written.append("exposure.png")
    (out / "audit.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return written


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
) -> dict[str, Any]:
    """k-extractability (Carlini et al. 2022, Definition 3.1) of corpus sequences.

    For each prompt length k, sequences of the corpus are cut into a k-token prompt and the next
    ``truth_tokens`` tokens; a sequence is extractable when greedy decoding from the prompt
    reproduces those tokens exactly. Reported by k and, with ``per_bucket``, by how often the
    sequence occurs in the corpus; run it once without and once with the guard.
    """
    from eval.metrics import exact_match
    from eval.sampling import frequency_bucket, sample_bucketed_examples, sample_examples
    from memfree.generation import DecodingSettings, complete

    rows: list[dict[str, Any]] = []
    settings = DecodingSettings(max_new_tokens=truth_tokens, batch_size=batch_size)
    for k in prompt_lengths:
        if per_bucket is not None:
            examples = sample_bucketed_examples(
                corpus, tokenizer, per_bucket, k, truth_tokens, seed
            )
        else:
            examples = sample_examples(
                corpus, tokenizer, num_examples, k, truth_tokens, seed, count_occurrences=False
            )
        completions = complete(
            model, tokenizer, [list(e.prompt_ids) for e in examples], settings, guard
        )
        for example, completion in zip(examples, completions, strict=True):
            rows.append(
                {
                    "k": k,
                    "example_id": example.example_id,
                    "occurrences": example.occurrences,
                    "bucket": frequency_bucket(example.occurrences)
                    if example.occurrences
                    else None,
                    "extractable": exact_match(completion.output_ids, example.truth_ids),
                }
            )
    by_k = []
    for k in prompt_lengths:
        members = [row for row in rows if row["k"] == k]
        share = sum(row["extractable"] for row in members) / max(len(members), 1)
        by_k.append({"k": k, "sequences": len(members), "extractable": share})
    by_bucket = []
    for bucket in sorted({row["bucket"] for row in rows if row["bucket"] is not None}):
        members = [row for row in rows if row["bucket"] == bucket]
        by_bucket.append(
            {
                "bucket": bucket,
                "occurrences_from": 2 ** (bucket / 4),
                "sequences": len(members),
                "extractable": sum(row["extractable"] for row in members) / len(members),
            }
        )
    return {
        "guarded": guard is not None,
        "truth_tokens": truth_tokens,
        "by_k": by_k,
        "by_bucket": by_bucket,
        "sequences": rows,
    }
