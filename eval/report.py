"""Summaries, Markdown reports and PNG plots of experiment records (the paper's Figure 6 scatter,
per-style bars as in Table 2 / Figure 4, and the interventions histogram of Figures 9-10)."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memfree.fileio import atomic_write


def summarize(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (style, defense): rates and means over its generations."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        groups[record["style"], record["defense"]].append(record)
    rows = []
    for (style, defense), members in sorted(groups.items(), key=_group_order):
        count = len(members)
        rows.append(
            {
                "style": style,
                "defense": defense,
                "generations": count,
                "verbatim_rate": sum(r["stored_ngrams"] > 0 for r in members) / count,
                "exact_match_rate": sum(bool(r["exact_match"]) for r in members) / count,
                "approximate_rate": sum(bool(r["approximately_memorized"]) for r in members)
                / count,
                "mean_bleu": float(np.mean([r["bleu"] for r in members])),
                "mean_edit_similarity": float(np.mean([r["edit_similarity"] for r in members])),
                "mean_interventions": float(np.mean([r["interventions"] for r in members])),
                "censored_rate": sum(bool(r.get("censored")) for r in members) / count,
            }
        )
        rows[-1].update(_optional_rates(members))
    return rows


# Counts a record may lack (a run before they existed, or without a word filter), and the rate
# of records where each is above 0: holding a stored token n-gram once the output's text is
# tokenized again, holding a stored word n-gram.
_OPTIONAL_RATES = {
    "stored_text_ngrams": "text_verbatim_rate",
    "stored_word_ngrams": "word_verbatim_rate",
}


def _optional_rates(members: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The rates of :data:`_OPTIONAL_RATES` over the members whose records hold the count."""
    rates = {}
    for field, rate in _OPTIONAL_RATES.items():
        counted = [r for r in members if r.get(field) is not None]
        if counted:
            rates[rate] = sum(r[field] > 0 for r in counted) / len(counted)
    return rates


def summarize_buckets(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rates per repetition bucket (the paper's 2^(i/4) buckets) and defense, original style."""
    groups: dict[tuple[int, str], list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("bucket") is not None and record["style"] == "original":
            groups[record["bucket"], record["defense"]].append(record)
    rows = []
    for (bucket, defense), members in sorted(
        groups.items(), key=lambda item: (item[0][0], _DEFENSE_ORDER.get(item[0][1], 9))
    ):
        rows.append(
            {
                "bucket": bucket,
                "occurrences_from": 2 ** (bucket / 4),
                "defense": defense,
                "generations": len(members),
                "verbatim_rate": sum(r["stored_ngrams"] > 0 for r in members) / len(members),
                "approximate_rate": sum(bool(r["approximately_memorized"]) for r in members)
                / len(members),
                "mean_bleu": float(np.mean([r["bleu"] for r in members])),
                **_optional_rates(members),
            }
        )
    return rows


_DEFENSE_ORDER = {"none": 0, "censor": 1, "memfree": 2, "word": 3}


def _group_order(item: tuple[tuple[str, str], Any]) -> tuple[int, str, int]:
    (style, defense), _ = item
    return (0 if style == "original" else 1, style, _DEFENSE_ORDER.get(defense, 9))


def write_report(
    out_dir: str | os.PathLike[str],
    records: Sequence[Mapping[str, Any]],
    settings: dict[str, Any],
    title: str,
) -> dict[str, Any]:
    """Write ``summary.json``, ``report.md`` and the PNG plots; returns the summary."""
    out = Path(out_dir)
    rows = summarize(records)
    signatures = sorted({r["signature"] for r in records})
    buckets = summarize_buckets(records)
    summary = {"settings": settings, "signatures": signatures, "rows": rows, "buckets": buckets}
    atomic_write(out / "summary.json", json.dumps(summary, indent=2))
    plots = _plots(out, records, rows)
    lines = [f"# {title}", ""]
    optional = [(rate, heading) for rate, heading in _OPTIONAL_COLUMNS if _has(rows, rate)]
    lines += [
        f"{len(records)} generations; metric signature"
        f"{'s' if len(signatures) > 1 else ''} {', '.join(f'`{x}`' for x in signatures) or '-'}.",
        "",
        "| style | defense | generations | verbatim (≥1 stored n-gram in its ids) | "
        + "".join(f"{heading} | " for _, heading in optional)
        + "exact match | approx. memorized (BLEU > threshold) | mean BLEU | mean edit sim. | "
        "interventions |",
        "|---|---|---:|---:|" + "---:|" * len(optional) + "---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['style']} | {row['defense']} | {row['generations']} | "
            f"{row['verbatim_rate']:.0%} | "
            + "".join(_rate_cell(row, rate) for rate, _ in optional)
            + f"{row['exact_match_rate']:.0%} | "
            f"{row['approximate_rate']:.0%} | {row['mean_bleu']:.3f} | "
            f"{row['mean_edit_similarity']:.3f} | {row['mean_interventions']:.2f} |"
        )
    lines += [
        "",
        "Defenses: *none* (the model as is), *censor* (a generation holding a stored "
        "n-gram is rejected and scores as empty), *memfree* (the token guard), *word* (the word "
        "guard: n-grams of normalized words, whatever their case, spacing or punctuation).",
        "",
    ]
    if _has(rows, "text_verbatim_rate"):
        lines += [_TEXT_COLUMN_NOTE, ""]
    if buckets:
        lines += _bucket_lines(buckets)
    for name, caption in plots:
        lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]
    examples = _examples(records)
    if examples:
        lines += ["## Examples: guarded outputs that still copy approximately", ""]
        for record in examples:
            lines += [
                f"**{record['example_id']}** ({record['style']}, {record['defense']} guard, "
                f"BLEU {record['bleu']:.2f}, "
                f"{record['interventions']} interventions)",
                "",
                "```",
                record["output"].strip()[:600],
                "```",
                "",
            ]
    lines.append(f"Settings: `{json.dumps(settings, sort_keys=True)}`")
    atomic_write(out / "report.md", "\n".join(lines) + "\n")
    return summary


_OPTIONAL_COLUMNS = (
    ("text_verbatim_rate", "≥1 stored n-gram in its text tokenized again"),
    ("word_verbatim_rate", "≥1 stored word n-gram"),
)
_TEXT_COLUMN_NOTE = (
    "*In its text tokenized again*: the decoded prompt and output tokenized again with the "
    "filter's tokenizer, as anyone who stores or forwards the text does; n-grams holding a token "
    "the output created or changed. The token guard's promise is over the ids it generated: a "
    "model may spell a stored passage with another token split, which this column finds."
)


def _has(rows: Sequence[Mapping[str, Any]], rate: str) -> bool:
    """Whether any row has this rate (a run that counted it)."""
    return any(rate in row for row in rows)


def _rate_cell(row: Mapping[str, Any], rate: str) -> str:
    """A table cell: the rate as a percentage, or "-" where this row's records lack it."""
    return f"{row[rate]:.0%} | " if rate in row else "- | "


def _bucket_lines(buckets: Sequence[Mapping[str, Any]]) -> list[str]:
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
            f"| {row['occurrences_from']:.1f} | {row['defense']} | {row['generations']} | "
            f"{row['verbatim_rate']:.0%} | "
            + (_rate_cell(row, "text_verbatim_rate") if text else "")
            + f"{row['approximate_rate']:.0%} | {row['mean_bleu']:.3f} |"
        )
    lines.append("")
    return lines


def _examples(records: Sequence[Mapping[str, Any]], count: int = 3) -> list[dict[str, Any]]:
    guarded = [
        r for r in records if r["defense"] in ("memfree", "word") and r["approximately_memorized"]
    ]
    return [dict(r) for r in sorted(guarded, key=lambda r: -r["bleu"])[:count]]


def _plots(
    out: Path, records: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    from memfree.errors import require

    require("matplotlib", "eval")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[tuple[str, str]] = []
    by_key = {(r["example_id"], r["style"], r["defense"]): r for r in records}
    pairs = [
        (r["bleu"], by_key[r["example_id"], r["style"], "memfree"]["bleu"])
        for r in records
        if r["defense"] == "none" and (r["example_id"], r["style"], "memfree") in by_key
    ]
    if pairs:
        figure, axis = plt.subplots(figsize=(4.5, 4.5))
        x, y = np.array(pairs).T
        axis.scatter(x, y, s=14, alpha=0.7)
        axis.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
        axis.set_xlabel("BLEU to the truth, unguarded")
        axis.set_ylabel("BLEU to the truth, MemFree")
        axis.set_xlim(-0.02, 1.02)
        axis.set_ylim(-0.02, 1.02)
        figure.tight_layout()
        figure.savefig(out / "scatter_bleu.png", dpi=120)
        plt.close(figure)
        made.append(("scatter_bleu.png", "Similarity to the truth with and without the guard"))
    styles = list(dict.fromkeys(row["style"] for row in rows))
    defenses = list(dict.fromkeys(row["defense"] for row in rows))
    if len(styles) > 1 or len(defenses) > 1:
        figure, axis = plt.subplots(figsize=(max(5.0, 1.0 * len(styles) + 2), 3.5))
        width = 0.8 / len(defenses)
        rates = {(row["style"], row["defense"]): row["approximate_rate"] for row in rows}
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
        figure.tight_layout()
        figure.savefig(out / "styles.png", dpi=120)
        plt.close(figure)
        made.append(("styles.png", "Share of approximately memorized continuations"))
    interventions = [r["interventions"] for r in records if r["defense"] in ("memfree", "word")]
    if interventions:
        figure, axis = plt.subplots(figsize=(4.5, 3.2))
        axis.hist(interventions, bins=[i - 0.5 for i in range(max(interventions) + 2)])
        axis.set_xlabel("interventions per generation")
        axis.set_ylabel("generations")
        figure.tight_layout()
        figure.savefig(out / "interventions.png", dpi=120)
        plt.close(figure)
        made.append(("interventions.png", "How often the guard changed the model's first choice"))
    return made
