"""What a build did: the summary printed at its end and returned as JSON (``--json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from bloom_builder.choices import OutputFormat, UnitName


@dataclass
class BuildSummary:
    """What a build did; printed at the end and available as JSON (``--json``)."""

    output: str
    unit: UnitName
    output_format: OutputFormat
    documents: int
    tokens: int
    ngrams: int
    distinct_ngrams: int
    kept_ngrams: int
    kept_prefixes: int
    num_bits: int
    num_probes: int
    expected_false_positive_rate: float
    size_bytes: int
    theoretical_minimum_bytes: float
    seconds: float
    tokens_per_second: float
    seconds_tokenizing: float
    seconds_hashing_counting: float
    cpu_seconds_hashing_counting: float
    map_tasks: int
    reused_tasks: int
    workers: int
    skipped: dict[str, Any] = field(default_factory=dict)
    layout: str = "blocked-512"
    seconds_writing: float = 0.0  # the write step's wall time (the driver's serial part for
    # the Bloom layout; for the index, the section tasks on the workers and the header)
    uniform_false_positive_rate: float | None = None  # the index's, per candidate of a row
    # that asks the whole vocabulary (``expected_false_positive_rate`` is per natural query)
    prefix_collision_rate: float | None = None  # the index's bound for any one query
    empty: bool = False  # the filter holds no n-gram: it blocks nothing (see ``warnings``)
    warnings: list[str] = field(default_factory=list)  # what the user should know (a message
    # naming settings by their fields, as :class:`~bloom_builder.settings.BuildSettings` does)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        counts = self.skipped.get("counts", {})
        if self.layout == "prefix-index":
            shape_lines = [
                f"wrote {self.output} (memfree prefix-index, {self.size_bytes:,} bytes; "
                f"{self.size_bytes / max(self.kept_ngrams, 1):.2f} bytes per n-gram)",
                f"  expected false bans per natural query "
                f"{self.expected_false_positive_rate:.3g}   per candidate {self.unit} of a "
                f"whole-vocabulary row {self.uniform_false_positive_rate or 0:.3g}   any query "
                f"at most {self.prefix_collision_rate or 0:.3g}",
            ]
        else:
            shape_lines = [
                f"wrote {self.output} ({self.output_format}, {self.size_bytes:,} bytes; n-gram "
                f"bits {self.num_bits / 8 / max(self.theoretical_minimum_bytes, 1):.2f}x the "
                "theoretical minimum)",
                f"  bits {self.num_bits:,}   probes {self.num_probes}   "
                f"expected false-positive rate {self.expected_false_positive_rate:.3g}",
            ]
        lines = [
            shape_lines[0],
            f"  documents {self.documents:,}   {self.unit}s {self.tokens:,}   "
            f"n-grams {self.ngrams:,}",
            f"  distinct {self.distinct_ngrams:,}   kept {self.kept_ngrams:,}"
            + ("" if self.layout == "prefix-index" else f"   prefixes {self.kept_prefixes:,}"),
            shape_lines[1],
            f"  time {self.seconds:.1f} s   {self.tokens_per_second:,.0f} {self.unit}s/s   "
            f"workers {self.workers}   tasks {self.map_tasks} ({self.reused_tasks} reused)",
        ]
        if counts:
            lines.append(
                "  skipped: "
                + ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items()))
            )
            for kind, examples in sorted(self.skipped.get("examples", {}).items()):
                for example in examples:
                    lines.append(f"    {kind}: {example}")
        return "\n".join(lines)
