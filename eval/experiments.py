"""The paper's experiments: discoverable memorization under defenses (Ippolito et al. 2023, §5,
Figures 6-10), style-transfer prompts (§4.2, Table 2) and utility impact (Appendix B.4, Table 1).

Results are JSONL records, one per generation, appended as they come: an interrupted run started
again with the same settings skips what is done. Each record holds the prompt, the truth, the
output, the defense, the style and the metrics, so anyone can recompute them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eval.metrics import MetricSettings, score, stored_ngrams
from eval.resultfiles import RecordLog, read_examples, read_settings_fingerprint, write_examples
from eval.sampling import Example, frequency_bucket, sample_examples
from eval.styles import apply_style, get_style

DEFENSES = ("none", "censor", "memfree", "word")
GUARDS = ("memfree", "word")  # defenses that generate with a guard
EXPERIMENTS = ("discoverable", "styles")


@dataclass(frozen=True)
class ExperimentSettings:
    """Everything that decides an experiment's records (recorded in its summary).

    Attributes:
        experiment: "discoverable" (defenses on original prompts) or "styles" (style-transferred
            prompts, with and without the guard).
        corpus: where prompts are drawn from (``memfree build`` inputs).
        num_examples: prompts drawn.
        prompt_tokens: k, prompt length in tokens (paper: 50).
        truth_tokens: m, true continuation length and new tokens generated (paper: 50).
        styles: style names (``+`` combines them).
        defenses: among "none", "censor" (reject a generation holding a stored n-gram, as a
            Copilot-style output filter does), "memfree" (the token guard) and "word" (the word
            guard, with a word filter: robust to case, spacing and punctuation).
        seed: sampling seed (prompts and decoding).
        batch_size: prompts per generate() call.
        count_occurrences: count each example's repetitions in the corpus (frequency buckets).
        per_bucket: instead of ``num_examples`` uniform draws, draw up to this many examples from
            each repetition bucket (2^(i/4) occurrences), as the paper's Figures 7-8 do.
        text_field: JSONL field / Parquet column of the corpus.
        metrics: metric settings.
    """

    experiment: str = "discoverable"
    corpus: tuple[str, ...] = ("stdlib:",)
    num_examples: int = 50
    prompt_tokens: int = 50
    truth_tokens: int = 50
    styles: tuple[str, ...] = ("original",)
    defenses: tuple[str, ...] = ("none", "censor", "memfree")
    seed: int = 0
    batch_size: int = 8
    count_occurrences: bool = False
    per_bucket: int | None = None
    text_field: str = "text"
    metrics: MetricSettings = field(default_factory=MetricSettings)

    def __post_init__(self) -> None:
        if self.experiment not in EXPERIMENTS:
            raise ValueError(f"experiment must be one of {', '.join(EXPERIMENTS)}")
        unknown = [d for d in self.defenses if d not in DEFENSES]
        if unknown or not self.defenses:
            raise ValueError(f"--defenses must be among {', '.join(DEFENSES)}, got {unknown}")
        for style in self.styles:
            get_style(style)  # raises ValueError naming the known styles
        if min(self.num_examples, self.prompt_tokens, self.truth_tokens, self.batch_size) < 1:
            raise ValueError("--num-examples, --prompt-tokens, --truth-tokens, --batch-size: >= 1")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["metrics"]["signature"] = self.metrics.signature()
        return data


def _settings_fingerprint(
    settings: ExperimentSettings,
    filter_metadata: dict[str, Any],
    model_name: str,
    word_metadata: dict[str, Any] | None = None,
) -> str:
    import xxhash

    data = settings.to_dict()
    # Written as the bool it was before "words" existed, so that older result directories resume.
    if data["metrics"]["normalize"] in ("none", "casefold"):
        data["metrics"]["normalize"] = data["metrics"]["normalize"] == "casefold"
    payload = {
        "settings": data,
        "model": model_name,
        "filter": filter_metadata.get("bits_xxh3"),
        "tokenizer": filter_metadata.get("tokenizer_fingerprint"),
    }
    if word_metadata is not None:  # absent before word filters existed: old runs still resume
        payload["word_filter"] = word_metadata.get("bits_xxh3")
    return xxhash.xxh3_64_hexdigest(json.dumps(payload, sort_keys=True).encode())


def run_memorization(
    settings: ExperimentSettings,
    out_dir: str | os.PathLike[str],
    model: Any,
    tokenizer: Any,
    ngram_filter: Any,
    *,
    model_name: str = "",
    progress: Callable[[int], Any] | None = None,
    examples: Sequence[Example] | None = None,
    word_filter: Any = None,
) -> list[dict[str, Any]]:
    """Run the discoverable-memorization or style-transfer experiment; returns all records.

    Args:
        settings: the experiment.
        out_dir: where ``records.jsonl``, ``examples.jsonl`` and ``settings.json`` go; a
            directory holding records of other settings, or a damaged one of these files, is
            refused (see :mod:`eval.resultfiles`).
        model: causal LM.
        tokenizer: its tokenizer.
        ngram_filter: the training corpus's filter (the guard's, and for counting stored n-grams).
        model_name: recorded in the settings file.
        progress: called with the number of generations just finished.
        examples: use these instead of sampling from ``settings.corpus``.
        word_filter: the corpus's word filter (``memfree build --unit word``): the "word"
            defense's guard; when given, every record also counts the stored word n-grams of
            its output.

    Raises:
        ValueError: the "word" defense without a word filter, or a filter of the wrong unit.
        eval.resultfiles.ResultFileError: a result file in ``out_dir`` is damaged (the message
            names the file, the line and the fix).
    """
    from memfree.generation import DecodingSettings, complete
    from memfree.processor import MemFreeLogitsProcessor

    if ngram_filter.unit != "token":
        raise ValueError(
            f"{ngram_filter.path}: a word filter given as the token filter; pass it as the word "
            "filter (--word-filter) and the corpus's token filter as the filter"
        )
    if word_filter is not None and word_filter.unit != "word":
        raise ValueError(
            f"{word_filter.path}: not a word filter (unit {word_filter.unit!r}); build one with "
            "`memfree build --unit word`"
        )
    if "word" in settings.defenses and word_filter is None:
        raise ValueError(
            "the 'word' defense needs a word filter (memfree build CORPUS --unit word); give it "
            "with --word-filter"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fingerprint = _settings_fingerprint(
        settings,
        ngram_filter.metadata,
        model_name,
        word_filter.metadata if word_filter is not None else None,
    )
    settings_path = out / "settings.json"
    if os.path.lexists(settings_path) and read_settings_fingerprint(settings_path) != fingerprint:
        raise ValueError(
            f"{out}: holds results of other settings (or another model or filter); choose "
            "another --out directory or delete it"
        )
    settings_path.write_text(
        json.dumps(
            {
                "fingerprint": fingerprint,
                "settings": settings.to_dict(),
                "model": model_name,
                "filter": str(ngram_filter.path),
                "word_filter": str(word_filter.path) if word_filter is not None else None,
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    examples = list(examples) if examples is not None else _examples(settings, out, tokenizer)
    log = RecordLog(out / "records.jsonl")
    decoding = DecodingSettings(
        max_new_tokens=settings.truth_tokens,
        batch_size=settings.batch_size,
        seed=settings.seed,
    )
    guards = {"memfree": MemFreeLogitsProcessor(ngram_filter, tokenizer=tokenizer)}
    if "word" in settings.defenses:
        guards["word"] = MemFreeLogitsProcessor(word_filter, tokenizer=tokenizer)
    for style in settings.styles:
        styled = [_styled(example, style, tokenizer) for example in examples]
        for defense_group in _defense_groups(settings.defenses):
            pending = [
                index
                for index, example in enumerate(examples)
                if any((example.example_id, style, d) not in log.done for d in defense_group)
            ]
            for begin in range(0, len(pending), settings.batch_size):
                chunk = pending[begin : begin + settings.batch_size]
                prompts = [styled[i][0] for i in chunk]
                guard = next((guards[d] for d in defense_group if d in GUARDS), None)
                # A styled truth may take more tokens than the original: generate enough for
                # the longest, then cut each output to its own truth's length.
                budget = max(styled[i][3] for i in chunk)
                completions = complete(
                    model,
                    tokenizer,
                    prompts,
                    replace(decoding, max_new_tokens=budget),
                    guard,
                    ngram_filter=ngram_filter,
                )
                completions = [
                    _cut(completion, styled[i][3], tokenizer)
                    for i, completion in zip(chunk, completions, strict=True)
                ]
                records = []
                for index, completion in zip(chunk, completions, strict=True):
                    for defense in defense_group:
                        if (examples[index].example_id, style, defense) in log.done:
                            continue
                        records.append(
                            _record(
                                examples[index],
                                style,
                                defense,
                                styled[index],
                                completion,
                                settings.metrics,
                                ngram_filter,
                                tokenizer,
                                word_filter,
                            )
                        )
                log.append(records)
                if progress is not None:
                    progress(len(chunk) * len(defense_group))
    return log.records


def _examples(settings: ExperimentSettings, out: Path, tokenizer: Any) -> list[Example]:
    """Sample the examples once and keep them beside the records (a resumed run reuses them)."""
    path = out / "examples.jsonl"
    if os.path.lexists(path):
        return read_examples(path)
    if settings.per_bucket is not None:
        from eval.sampling import sample_bucketed_examples

        examples = sample_bucketed_examples(
            settings.corpus,
            tokenizer,
            settings.per_bucket,
            settings.prompt_tokens,
            settings.truth_tokens,
            settings.seed,
            settings.text_field,
        )
    else:
        examples = sample_examples(
            settings.corpus,
            tokenizer,
            settings.num_examples,
            settings.prompt_tokens,
            settings.truth_tokens,
            settings.seed,
            settings.text_field,
            settings.count_occurrences,
        )
    if not examples:
        raise ValueError(
            f"no document in {', '.join(settings.corpus)} is long enough for "
            f"{settings.prompt_tokens}+{settings.truth_tokens} tokens"
        )
    write_examples(path, examples)
    return examples


def _defense_groups(defenses: Sequence[str]) -> list[tuple[str, ...]]:
    """Defenses sharing one generation: "none" and "censor" both use the unguarded output."""
    groups: list[tuple[str, ...]] = []
    unguarded = tuple(d for d in defenses if d in ("none", "censor"))
    if unguarded:
        groups.append(unguarded)
    groups.extend((guard,) for guard in GUARDS if guard in defenses)
    return groups


def _styled(
    example: Example, style: str, tokenizer: Any
) -> tuple[Any, str, tuple[int, ...] | None, int]:
    """(prompt for the model, truth text in the style, truth ids when the style is the original,
    tokens to generate: the styled truth's length in tokens)."""
    prompt_text = tokenizer.decode(list(example.prompt_ids))
    truth_text = tokenizer.decode(list(example.truth_ids))
    if style == "original":
        return list(example.prompt_ids), truth_text, example.truth_ids, len(example.truth_ids)
    styled_prompt, styled_truth = apply_style(style, prompt_text, truth_text)
    length = len(tokenizer(styled_truth, add_special_tokens=False)["input_ids"])
    return styled_prompt, styled_truth, None, max(length, 1)


def _cut(completion: Any, length: int, tokenizer: Any) -> Any:
    """The completion with its output cut to ``length`` tokens (interventions after dropped)."""
    if len(completion.output_ids) <= length:
        return completion
    return replace(
        completion,
        output_ids=completion.output_ids[:length],
        text=tokenizer.decode(completion.output_ids[:length]),
        interventions=[item for item in completion.interventions if item.position < length],
    )


def _record(
    example: Example,
    style: str,
    defense: str,
    styled: tuple[Any, str, tuple[int, ...] | None, int],
    completion: Any,
    metrics: MetricSettings,
    ngram_filter: Any,
    tokenizer: Any,
    word_filter: Any = None,
) -> dict[str, Any]:
    prompt, truth, truth_ids, _ = styled
    found = stored_ngrams(ngram_filter, completion.prompt_ids, completion.output_ids)
    censored = defense == "censor" and found.stored > 0
    output = "" if censored else completion.text
    output_ids = [] if censored else completion.output_ids
    scores = score(output, truth, metrics, output_ids if truth_ids else None, truth_ids)
    words = None
    if word_filter is not None:
        words = stored_ngrams(word_filter, completion.prompt_ids, output_ids, tokenizer=tokenizer)
    return {
        "example_id": example.example_id,
        "source": example.source,
        "occurrences": example.occurrences,
        "bucket": frequency_bucket(example.occurrences) if example.occurrences else None,
        "style": style,
        "defense": defense,
        "prompt": prompt if isinstance(prompt, str) else tokenizer.decode(prompt),
        "truth": truth,
        "output": output,
        "censored": censored,
        "bleu": scores.bleu,
        "edit_similarity": scores.edit_similarity,
        "exact_match": scores.exact_match,
        "approximately_memorized": scores.approximately_memorized,
        "stored_ngrams": 0 if censored else found.stored,
        "ngrams": 0 if censored else found.total,
        "interventions": len(completion.interventions) if defense in GUARDS else 0,
        "signature": scores.signature,
        **(
            {"stored_word_ngrams": words.stored, "word_ngrams": words.total}
            if words is not None
            else {}
        ),
    }


def run_utility(
    texts: Sequence[str], tokenizer: Any, ngram_filter: Any, max_examples: int = 5
) -> dict[str, Any]:
    """Utility impact (Appendix B.4, Table 1): how much ordinary text the filter would block.

    Args:
        texts: reference texts (e.g. held-out documents the model should still be able to write).
        tokenizer: the filter's tokenizer (unused for a word filter, whose n-grams are those of
            the text's normalized words).
        ngram_filter: the filter.
        max_examples: texts with stored n-grams to quote.

    Returns:
        texts, texts holding a stored n-gram (count and share), n-grams and stored n-grams (count
        and share), and examples.
    """
    import sys

    import numpy as np
    from tqdm import tqdm

    from memfree.words import word_hashes_np, words

    n = ngram_filter.n
    texts_blocked = ngrams_total = ngrams_stored = 0
    examples: list[dict[str, Any]] = []
    for text in tqdm(texts, desc="utility", unit="text", file=sys.stderr, leave=False):
        if ngram_filter.unit == "word":
            found_words = words(text)
            stored = (
                ngram_filter.contains(
                    np.ascontiguousarray(
                        np.lib.stride_tricks.sliding_window_view(word_hashes_np(found_words), n)
                    )
                )
                if len(found_words) >= n
                else np.zeros(0, dtype=bool)
            )
            total = int(stored.shape[0])
        else:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            counted = stored_ngrams(ngram_filter, [], ids)
            total = counted.total
            stored = None
        hits = int(stored.sum()) if stored is not None else counted.stored
        ngrams_total += total
        ngrams_stored += hits
        if not hits:
            continue
        texts_blocked += 1
        if len(examples) >= max_examples:
            continue
        if stored is not None:
            first = int(np.flatnonzero(stored)[0])
            shown = " ".join(found_words[first : first + n])
        else:
            windows = np.lib.stride_tricks.sliding_window_view(np.asarray(ids), n)
            first = int(np.flatnonzero(ngram_filter.contains(np.ascontiguousarray(windows)))[0])
            shown = tokenizer.decode(ids[first : first + n])
        examples.append({"text": text[:200], "first_stored_ngram": shown, "stored_ngrams": hits})
    count = len(texts)
    return {
        "texts": count,
        "texts_with_stored_ngram": texts_blocked,
        "share_of_texts": texts_blocked / count if count else 0.0,
        "ngrams": ngrams_total,
        "stored_ngrams": ngrams_stored,
        "share_of_ngrams": ngrams_stored / ngrams_total if ngrams_total else 0.0,
        "examples": examples,
    }
