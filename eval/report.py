"""Markdown reports and PNG plots of experiment records (the paper's Figure 6 scatter, per-style
bars as in Table 2 / Figure 4, and the interventions histogram of Figures 9-10), beside their
summary (:mod:`eval.summary`). Records are typed once on the way in; the rest reads attributes."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eval.defenses import DEFENSE_NAMES, find_defense, get_defense, is_guarded
from eval.records import MemorizationRecord
from eval.summary import (
    BucketRow,
    Summary,
    SummaryRow,
    as_records,
    as_scored,
    bucket_rows,
    summary_rows,
)
from memfree.fileio import atomic_write
from memfree.units import TOKEN


def summarize(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (style, defense): rates and means over its generations (typed:
    :func:`eval.summary.summary_rows`)."""
    return [row.to_dict() for row in summary_rows(as_scored(records))]


def summarize_buckets(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rates per repetition bucket (the paper's 2^(i/4) buckets) and defense, original style
    (typed: :func:`eval.summary.bucket_rows`)."""
    return [row.to_dict() for row in bucket_rows(as_scored(records))]


def write_report(
    out_dir: str | os.PathLike[str],
    records: Sequence[Mapping[str, Any]],
    settings: dict[str, Any],
    title: str,
) -> dict[str, Any]:
    """Write ``summary.json``, ``report.md`` and the PNG plots; returns the summary (typed:
    :func:`write_summary`)."""
    return write_summary(out_dir, records, settings, title).to_dict()


def write_summary(
    out_dir: str | os.PathLike[str],
    records: Sequence[Mapping[str, Any]],
    settings: dict[str, Any],
    title: str,
) -> Summary:
    """Write ``summary.json``, ``report.md`` and the PNG plots of a run's records.

    Args:
        out_dir: the run's folder.
        records: its records, typed or as read back from ``records.jsonl``.
        settings: its settings (``ExperimentSettings.to_dict()``), recorded in the summary.
        title: the report's heading.

    Returns:
        the summary written.
    """
    out = Path(out_dir)
    typed = as_records(records)
    summary = Summary.of(typed, settings)
    atomic_write(out / "summary.json", json.dumps(summary.to_dict(), indent=2))
    plots = _plots(out, typed, summary.rows)
    lines = [f"# {title}", ""]
    lines += _table_lines(summary, len(typed))
    if summary.buckets:
        lines += _bucket_lines(summary.buckets)
    for name, caption in plots:
        lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]
    lines += _example_lines(typed)
    lines.append(f"Settings: `{json.dumps(settings, sort_keys=True)}`")
    atomic_write(out / "report.md", "\n".join(lines) + "\n")
    return summary


def _table_lines(summary: Summary, generations: int) -> list[str]:
    """The table by style and defense, and what its columns and the defenses mean."""
    signatures = summary.signatures
    optional = [(rate, heading) for rate, heading in _OPTIONAL_COLUMNS if _has(summary.rows, rate)]
    lines = [
        f"{generations} generations; metric signature"
        f"{'s' if len(signatures) > 1 else ''} {', '.join(f'`{x}`' for x in signatures) or '-'}.",
        "",
        "| style | defense | generations | verbatim (≥1 stored n-gram in its ids) | "
        + "".join(f"{heading} | " for _, heading in optional)
        + "exact match | approx. memorized (BLEU > threshold) | mean BLEU | mean edit sim. | "
        "interventions |",
        "|---|---|---:|---:|" + "---:|" * len(optional) + "---:|---:|---:|---:|---:|",
    ]
    for row in summary.rows:
        lines.append(
            f"| {row.style} | {row.defense} | {row.generations} | {row.verbatim_rate:.0%} | "
            + "".join(_rate_cell(row, rate) for rate, _ in optional)
            + f"{row.exact_match_rate:.0%} | "
            f"{row.approximate_rate:.0%} | {row.mean_bleu:.3f} | "
            f"{row.mean_edit_similarity:.3f} | {row.mean_interventions:.2f} |"
        )
    described = ", ".join(f"*{name}* ({get_defense(name).description})" for name in DEFENSE_NAMES)
    lines += ["", f"Defenses: {described}.", ""]
    if _has(summary.rows, "text_verbatim_rate"):
        lines += [_TEXT_COLUMN_NOTE, ""]
    return lines


_OPTIONAL_COLUMNS = (
    ("text_verbatim_rate", "≥1 stored n-gram in its text tokenized again"),
    ("word_verbatim_rate", "≥1 stored word n-gram"),
)
_TEXT_COLUMN_NOTE = (
    "*In its text tokenized again*: the decoded prompt and output tokenized again with the "
    "filter's tokenizer, as anyone who stores or forwards the text does; n-grams holding a token "
    "the output created or changed. With canonical decoding (*memfree*) the token guard keeps "
    "this at 0 too; over the ids only (*memfree-ids*) its promise is over the ids it generated: "
    "a model may spell a stored passage with another token split, which this column finds."
)


def _has(rows: Sequence[SummaryRow] | Sequence[BucketRow], rate: str) -> bool:
    """Whether any row has this rate (a run that counted it)."""
    return any(getattr(row, rate) is not None for row in rows)


def _rate_cell(row: SummaryRow | BucketRow, rate: str) -> str:
    """A table cell: the rate as a percentage, or "-" where this row's records lack it."""
    value = getattr(row, rate)
    return f"{value:.0%} | " if value is not None else "- | "


def _bucket_lines(buckets: Sequence[BucketRow]) -> list[str]:
    """The table by repetition bucket (original prompts)."""
    text = _has(buckets, "text_verbatim_rate")
    lines = [
        "## By repetitions in the corpus (original prompts)",
        "",
        "| occurrences ≥ | defense | generations | verbatim | "
        + ("verbatim in its text tokenized again | " if text else "")
        + "approx. memorized | mean BLEU |",
        "|---:|---|---:|---:|" + ("---:|" if text else "") + "---:|---:|",
    ]
    for row in buckets:
        lines.append(
            f"| {row.occurrences_from:.1f} | {row.defense} | {row.generations} | "
            f"{row.verbatim_rate:.0%} | "
            + (_rate_cell(row, "text_verbatim_rate") if text else "")
            + f"{row.approximate_rate:.0%} | {row.mean_bleu:.3f} |"
        )
    lines.append("")
    return lines


def _example_lines(records: Sequence[MemorizationRecord], count: int = 3) -> list[str]:
    """The guarded outputs that copy the truth most closely, though approximately memorized."""
    guarded = [r for r in records if is_guarded(r.defense) and r.approximately_memorized]
    examples = sorted(guarded, key=lambda r: -r.bleu)[:count]
    if not examples:
        return []
    lines = ["## Examples: guarded outputs that still copy approximately", ""]
    for record in examples:
        lines += [
            f"**{record.example_id}** ({record.style}, {record.defense} guard, "
            f"BLEU {record.bleu:.2f}, {record.interventions} interventions)",
            "",
            "```",
            record.output.strip()[:600],
            "```",
            "",
        ]
    return lines


def _plots(
    out: Path, records: Sequence[MemorizationRecord], rows: Sequence[SummaryRow]
) -> list[tuple[str, str]]:
    """Draw the PNG plots the records call for; (file name, caption) of each."""
    from memfree.errors import require

    require("matplotlib", "eval")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[tuple[str, str]] = []
    for plot in (_scatter_plot, _styles_plot, _interventions_plot):
        drawn = plot(plt, records, rows)
        if drawn is not None:
            figure, name, caption = drawn
            figure.tight_layout()
            figure.savefig(out / name, dpi=120)
            plt.close(figure)
            made.append((name, caption))
    return made


def _scatter_plot(
    plt: Any, records: Sequence[MemorizationRecord], rows: Sequence[SummaryRow]
) -> tuple[Any, str, str] | None:
    """BLEU to the truth of each output, unguarded against the token guard's (Figure 6)."""
    plain, guarded = find_defense(guard_unit=None).name, find_defense(guard_unit=TOKEN).name
    by_key = {(r.example_id, r.style, r.defense): r for r in records}
    pairs = [
        (r.bleu, by_key[r.example_id, r.style, guarded].bleu)
        for r in records
        if r.defense == plain and (r.example_id, r.style, guarded) in by_key
    ]
    if not pairs:
        return None
    figure, axis = plt.subplots(figsize=(4.5, 4.5))
    x, y = np.array(pairs).T
    axis.scatter(x, y, s=14, alpha=0.7)
    axis.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
    axis.set_xlabel("BLEU to the truth, unguarded")
    axis.set_ylabel("BLEU to the truth, MemFree")
    axis.set_xlim(-0.02, 1.02)
    axis.set_ylim(-0.02, 1.02)
    return figure, "scatter_bleu.png", "Similarity to the truth with and without the guard"


def _styles_plot(
    plt: Any, records: Sequence[MemorizationRecord], rows: Sequence[SummaryRow]
) -> tuple[Any, str, str] | None:
    """The share approximately memorized, by style and defense (Table 2 as bars)."""
    styles = list(dict.fromkeys(row.style for row in rows))
    defenses = list(dict.fromkeys(row.defense for row in rows))
    if len(styles) <= 1 and len(defenses) <= 1:
        return None
    figure, axis = plt.subplots(figsize=(max(5.0, 1.0 * len(styles) + 2), 3.5))
    width = 0.8 / len(defenses)
    rates = {(row.style, row.defense): row.approximate_rate for row in rows}
    for offset, defense in enumerate(defenses):
        axis.bar(
            np.arange(len(styles)) + offset * width,
            [rates.get((style, defense), 0.0) for style in styles],
            width,
            label=defense,
        )
    axis.set_xticks(np.arange(len(styles)) + width * (len(defenses) - 1) / 2)
    axis.set_xticklabels(styles, rotation=30, ha="right")
    axis.set_ylabel("approximately memorized")
    axis.legend()
    return figure, "styles.png", "Share of approximately memorized continuations"


def _interventions_plot(
    plt: Any, records: Sequence[MemorizationRecord], rows: Sequence[SummaryRow]
) -> tuple[Any, str, str] | None:
    """How many steps the guard changed per guarded generation (Figures 9-10)."""
    interventions = [r.interventions for r in records if is_guarded(r.defense)]
    if not interventions:
        return None
    figure, axis = plt.subplots(figsize=(4.5, 3.2))
    axis.hist(interventions, bins=[i - 0.5 for i in range(max(interventions) + 2)])
    axis.set_xlabel("interventions per generation")
    axis.set_ylabel("generations")
    return figure, "interventions.png", "How often the guard changed the model's first choice"


__all__ = ["summarize", "summarize_buckets", "write_report", "write_summary"]
