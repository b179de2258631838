"""The audit's report: ``audit.json`` (every result with its settings and signature),
``audit.md`` (exposure, extraction and k-extractability tables) and ``exposure.png``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eval.audit_results import (
    RESULT_SECTIONS,
    ExposureResult,
    ExtractabilityResult,
    ExtractionResult,
    audit_result,
)
from eval.exposure import RANDOM_GUESSING_MEDIAN
from memfree.fileio import atomic_write

# The kind of results folder (eval.resultdirs.KINDS) each step's results make.
_KINDS = {
    ExposureResult: "audit exposure",
    ExtractionResult: "audit extract",
    ExtractabilityResult: "audit extractable",
}


def write_audit_report(
    out_dir: str | os.PathLike[str],
    results: dict[str, Any],
    title: str,
    *,
    overwrite: bool = False,
) -> list[str]:
    """``audit.json``, ``audit.md`` and, for exposure results, ``exposure.png``; returns the
    names written.

    Args:
        out_dir: the report's folder: a new or empty one, or one of the same step's report (its
            files are replaced: the report is rendered again); another only with ``overwrite``.
        results: label ("unguarded", "guarded") -> the step's result, typed or as its JSON
            (:func:`eval.audit_results.audit_result` parses it).
        title: the report's heading.
        overwrite: write into a non-empty folder of another kind (``--force``).

    Raises:
        eval.resultdirs.ResultsDirError: ``out_dir`` is refused (see :mod:`eval.resultdirs`), or
            another run holds its lock.
    """
    from eval.resultdirs import claim_results_dir

    with claim_results_dir(out_dir, audit_kind(results), overwrite) as out:
        return _write(out, results, title)


def audit_kind(results: Mapping[str, Any]) -> str:
    """The kind of results folder (:data:`eval.resultdirs.KINDS`) ``results`` make: that of the
    audit step whose results they are (typed, or the section of their JSON)."""
    for result_type, section in RESULT_SECTIONS:
        for part in results.values():
            if isinstance(part, result_type) or (isinstance(part, Mapping) and section in part):
                return _KINDS[result_type]
    raise ValueError("results of no audit step (exposure, extract, extractable) to write")


def _write(out: Path, results: dict[str, Any], title: str) -> list[str]:
    # audit.json holds a result given as JSON as it was given; a typed one as its to_dict().
    plain = {
        label: part.to_dict() if hasattr(part, "to_dict") else part
        for label, part in results.items()
    }
    atomic_write(out / "audit.json", json.dumps(plain, indent=2))
    typed = {label: audit_result(part) for label, part in results.items() if _is_result(part)}
    lines = [f"# {title}", ""]
    written = ["audit.json", "audit.md"]
    for label, part in typed.items():
        lines += _SECTIONS[type(part)](label, part)
    exposures = {k: v for k, v in typed.items() if isinstance(v, ExposureResult)}
    if exposures:
        _exposure_plot(out, exposures)
        lines += ["![exposure against repetitions](exposure.png)", ""]
        written.append("exposure.png")
    atomic_write(out / "audit.md", "\n".join(lines) + "\n")
    return written


def _is_result(part: Any) -> bool:
    """Whether ``part`` is a step's result, typed or as JSON (anything else is not reported)."""
    if isinstance(part, (ExposureResult, ExtractionResult, ExtractabilityResult)):
        return True
    return isinstance(part, Mapping) and any(section in part for _, section in RESULT_SECTIONS)


def _exposure_lines(label: str, part: ExposureResult) -> list[str]:
    lines = [
        f"## Exposure ({label}): |R| = {part.space_size:,}, maximum "
        f"{part.max_exposure:.1f} bits, {part.references:,} references "
        f"({'all of R' if part.exact else 'sampled'})",
        "",
        "| repetitions | canaries | median exposure | 10%–90% | ε lower bound |",
        "|---:|---:|---:|---:|---:|",
    ]
    for group in part.by_repetitions:
        low, high = group.quantiles_10_90
        lines.append(
            f"| {group.repetitions} | {group.canaries} | "
            f"{group.median_exposure:.2f} | {low:.2f}–{high:.2f} | "
            f"{group.epsilon_lower_bound:.2f} |"
        )
    lines += [
        "",
        "Random guessing gives a median exposure of 1 (mean 1/ln 2 ≈ 1.44). The ε bound "
        "(Jagielski: ε ≥ ln 2 · (exposure − 1) / repetitions) holds only for the median "
        "over many canaries, assumes the canaries are drawn as the DP definition's "
        "neighbouring datasets differ, and a low exposure proves nothing about privacy.",
        "",
    ]
    return lines


def _extraction_lines(label: str, part: ExtractionResult) -> list[str]:
    search = part.shortest_path
    lines = [
        f"## Extraction ({label})",
        "",
        "| canary | repetitions | greedy from the prefix |",
        "|---|---:|---|",
    ]
    for row in part.canaries:
        lines.append(
            f"| `{row.canary}` | {row.repetitions} | "
            f"{'recovered' if row.greedy_recovered else 'not recovered'} |"
        )
    lines += [
        "",
        f"Shortest-path search: best secret `{search.guess}` after {search.queries:,} "
        f"scored sequences (brute force: {search.brute_force_queries:,}); "
        + (
            f"it is the canary inserted {search.recovered_repetitions} times."
            if search.recovered_canary
            else "it is no planted canary."
        ),
        "",
    ]
    return lines


def _extractability_lines(label: str, part: ExtractabilityResult) -> list[str]:
    lines = [
        f"## k-extractability ({label}): greedy reproduces the next "
        f"{part.truth_tokens} tokens exactly",
        "",
        "| k (prompt tokens) | sequences | extractable |",
        "|---:|---:|---:|",
    ]
    lines += [f"| {row.k} | {row.sequences} | {row.extractable:.0%} |" for row in part.by_k]
    if part.by_bucket:
        lines += [
            "",
            "| occurrences ≥ | sequences | extractable |",
            "|---:|---:|---:|",
        ]
        lines += [
            f"| {row.occurrences_from:.1f} | {row.sequences} | {row.extractable:.0%} |"
            for row in part.by_bucket
        ]
    lines.append("")
    return lines


_SECTIONS: dict[type, Callable[[str, Any], list[str]]] = {
    ExposureResult: _exposure_lines,
    ExtractionResult: _extraction_lines,
    ExtractabilityResult: _extractability_lines,
}


def _exposure_plot(out: Path, parts: Mapping[str, ExposureResult]) -> None:
    """``exposure.png``: median exposure against repetitions, one line per label."""
    from memfree.errors import require

    require("matplotlib", "eval")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.5))
    for label, part in parts.items():
        groups = part.by_repetitions
        axis.plot(
            [g.repetitions for g in groups],
            [g.median_exposure for g in groups],
            marker="o",
            label=label,
        )
        axis.axhline(part.max_exposure, color="grey", linewidth=0.6, linestyle=":")
    axis.axhline(RANDOM_GUESSING_MEDIAN, color="grey", linewidth=0.6)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("times the canary was inserted")
    axis.set_ylabel("median exposure (bits)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "exposure.png", dpi=120)
    plt.close(figure)


__all__ = ["audit_kind", "write_audit_report"]
