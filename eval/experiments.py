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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eval.metrics import MetricSettings, score, stored_ngrams
from eval.records import MemorizationRecord, MemorizationResults
from eval.resultdirs import claim_results_dir
from eval.resultfiles import RecordLog, read_examples, read_settings_fingerprint, write_examples
from eval.sampling import Example, frequency_bucket, sample_examples
from eval.settings import GUARDS, ExperimentSettings, settings_fingerprint
from eval.styles import apply_style
from memfree.fileio import atomic_write


def check_filters(ngram_filter: Any, word_filter: Any = None) -> None:
    """Refuse a filter of the other unit given as the token filter (``--filter``) or the word
    filter (``--word-filter``); the command line calls this before it loads the model.

    Raises:
        ValueError: naming the file, what it is, and what the option takes.
    """
    if ngram_filter is not None and ngram_filter.unit != "token":
        raise ValueError(
            f"{ngram_filter.path}: a {ngram_filter.unit} filter given as the token filter "
            "(--filter); pass it as the word filter (--word-filter) and the corpus's token filter "
            "as --filter"
        )
    if word_filter is not None and word_filter.unit != "word":
        raise ValueError(
            f"{word_filter.path}: not a word filter: a {word_filter.unit} filter given as "
            "--word-filter, which takes a word filter (memfree build CORPUS --unit word)"
        )


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
    overwrite: bool = False,
) -> MemorizationResults:
    """Run the discoverable-memorization or style-transfer experiment; returns all its records.

    Args:
        settings: the experiment.
        out_dir: where ``records.jsonl``, ``examples.jsonl`` and ``settings.json`` go; a
            directory holding records of other settings, a damaged one of these files, or a
            record that is not this run's or is there twice, is refused (see
            :mod:`eval.resultfiles`). The run holds the folder's lock (another run writing there
            is refused) and writes only into a new, empty or eval folder (see
            :mod:`eval.resultdirs`).
        model: causal LM.
        tokenizer: its tokenizer.
        ngram_filter: the training corpus's filter (the guard's, and for counting stored n-grams).
        model_name: recorded in the settings file.
        progress: called with the number of generations just finished.
        examples: use these instead of sampling from ``settings.corpus``.
        word_filter: the corpus's word filter (``memfree build --unit word``): the "word"
            defense's guard; when given, every record also counts the stored word n-grams of
            its output.
        overwrite: write into a non-empty ``out_dir`` that holds no eval results (``--force``).

    Raises:
        ValueError: the "word" defense without a word filter, a filter of the wrong unit, or a
            corpus without ``settings.num_examples`` documents long enough.
        eval.resultfiles.ResultFileError: a result file in ``out_dir`` is damaged or holds
            another run's or a duplicate record (the message names the file, the line and the
            fix).
        eval.resultdirs.ResultsDirError: ``out_dir`` is another kind of folder, or another run
            holds its lock.
    """
    check_filters(ngram_filter, word_filter)
    if "word" in settings.defenses and word_filter is None:
        raise ValueError(
            "the 'word' defense needs a word filter (memfree build CORPUS --unit word); give it "
            "with --word-filter"
        )
    with claim_results_dir(out_dir, "eval", overwrite) as out:
        return _run_in_folder(
            settings,
            out,
            model,
            tokenizer,
            ngram_filter,
            model_name,
            progress,
            examples,
            word_filter,
        )


def _run_in_folder(
    settings: ExperimentSettings,
    out: Path,
    model: Any,
    tokenizer: Any,
    ngram_filter: Any,
    model_name: str,
    progress: Callable[[int], Any] | None,
    examples: Sequence[Example] | None,
    word_filter: Any,
) -> MemorizationResults:
    """:func:`run_memorization` in its claimed folder."""
    from memfree.engines.transformers import MemFreeLogitsProcessor
    from memfree.generation import DecodingSettings

    recorded = _recorded_settings(out, settings, model_name, ngram_filter, word_filter)
    fingerprint = recorded["fingerprint"]
    drawn = examples is None and not os.path.lexists(out / "examples.jsonl")
    examples = list(examples) if examples is not None else _examples(settings, out, tokenizer)
    # Written once the examples are drawn: a corpus too small for the settings leaves nothing
    # behind, so the same command with other settings can use the folder.
    atomic_write(out / "settings.json", json.dumps(recorded, indent=2))
    if drawn:
        write_examples(out / "examples.jsonl", examples)
    log = RecordLog(
        out / "records.jsonl",
        example_ids={example.example_id for example in examples},
        styles=settings.styles,
        defenses=settings.defenses,
    )
    decoding = DecodingSettings(
        max_new_tokens=settings.truth_tokens,
        batch_size=settings.batch_size,
        seed=settings.seed,
    )
    guards = {"memfree": MemFreeLogitsProcessor(ngram_filter, tokenizer=tokenizer)}
    if "word" in settings.defenses:
        guards["word"] = MemFreeLogitsProcessor(word_filter, tokenizer=tokenizer)
    run = _Run(model, tokenizer, ngram_filter, word_filter, settings.metrics, decoding, guards)
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
                records = run.chunk(examples, styled, style, defense_group, chunk, log.done)
                log.append(record.to_dict() for record in records)
                if progress is not None:
                    progress(len(chunk) * len(defense_group))
    return MemorizationResults(
        tuple(MemorizationRecord.from_dict(record) for record in log.records),
        recorded,
        fingerprint,
    )


def _recorded_settings(
    out: Path, settings: ExperimentSettings, model_name: str, ngram_filter: Any, word_filter: Any
) -> dict[str, Any]:
    """What ``settings.json`` records of this run, refusing a directory of another run."""
    fingerprint = settings_fingerprint(
        settings,
        ngram_filter.metadata,
        model_name,
        word_filter.metadata if word_filter is not None else None,
    )
    settings_path = out / "settings.json"
    if os.path.lexists(settings_path) and read_settings_fingerprint(settings_path) != fingerprint:
        raise ValueError(
            f"{out}: holds results of other settings (or another model or filter: its "
            "settings.json); choose another --out directory, or delete that one to start afresh "
            "(--force does not: memfree never deletes results)"
        )
    recorded = {
        "fingerprint": fingerprint,
        "settings": settings.to_dict(),
        "model": model_name,
        "filter": str(ngram_filter.path),
        "word_filter": str(word_filter.path) if word_filter is not None else None,
    }
    return recorded


@dataclass(frozen=True)
class _Run:
    """What every batch of one run generates and scores with."""

    model: Any
    tokenizer: Any
    ngram_filter: Any
    word_filter: Any
    metrics: MetricSettings
    decoding: Any
    guards: dict[str, Any]

    def chunk(
        self,
        examples: Sequence[Example],
        styled: Sequence[tuple[Any, str, tuple[int, ...] | None, int]],
        style: str,
        defense_group: tuple[str, ...],
        chunk: list[int],
        done: set[tuple[str, str, str]],
    ) -> list[MemorizationRecord]:
        """One generate() call for the examples ``chunk`` and a record per defense not done."""
        from memfree.generation import complete

        guard = next((self.guards[d] for d in defense_group if d in GUARDS), None)
        # A styled truth may take more tokens than the original: generate enough for the
        # longest, then cut each output to its own truth's length.
        budget = max(styled[i][3] for i in chunk)
        completions = complete(
            self.model,
            self.tokenizer,
            [styled[i][0] for i in chunk],
            replace(self.decoding, max_new_tokens=budget),
            guard,
            ngram_filter=self.ngram_filter,
        )
        records = []
        for index, completion in zip(chunk, completions, strict=True):
            completion = _cut(completion, styled[index][3], self.tokenizer)
            for defense in defense_group:
                if (examples[index].example_id, style, defense) in done:
                    continue
                records.append(
                    _record(
                        examples[index],
                        style,
                        defense,
                        styled[index],
                        completion,
                        self.metrics,
                        self.ngram_filter,
                        self.tokenizer,
                        self.word_filter,
                    )
                )
        return records


def _examples(settings: ExperimentSettings, out: Path, tokenizer: Any) -> list[Example]:
    """The examples of ``examples.jsonl`` (a resumed run reuses them), else drawn from the corpus
    (the caller keeps them there)."""
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
            required=True,
        )
    if not examples:
        raise ValueError(
            f"no document in {', '.join(settings.corpus)} is long enough for "
            f"{settings.prompt_tokens}+{settings.truth_tokens} tokens"
        )
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
    """The completion with its output cut to ``length`` tokens (interventions after dropped; its
    counts of stored n-grams, which were of the whole output, dropped too: the record counts)."""
    if len(completion.output_ids) <= length:
        return completion
    return replace(
        completion,
        output_ids=completion.output_ids[:length],
        text=tokenizer.decode(completion.output_ids[:length]),
        interventions=[item for item in completion.interventions if item.position < length],
        stored_ngrams=None,
        stored_text_ngrams=None,
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
) -> MemorizationRecord:
    prompt, truth, truth_ids, _ = styled
    found = stored_ngrams(ngram_filter, completion.prompt_ids, completion.output_ids)
    censored = defense == "censor" and found.stored > 0
    output = "" if censored else completion.text
    output_ids = [] if censored else completion.output_ids
    in_text = stored_ngrams(
        ngram_filter, completion.prompt_ids, output_ids, tokenizer=tokenizer, text=True
    )
    scores = score(output, truth, metrics, output_ids if truth_ids else None, truth_ids)
    words = None
    if word_filter is not None:
        words = stored_ngrams(word_filter, completion.prompt_ids, output_ids, tokenizer=tokenizer)
    return MemorizationRecord(
        example_id=example.example_id,
        source=example.source,
        occurrences=example.occurrences,
        bucket=frequency_bucket(example.occurrences) if example.occurrences else None,
        style=style,
        defense=defense,
        prompt=prompt if isinstance(prompt, str) else tokenizer.decode(prompt),
        truth=truth,
        output=output,
        censored=censored,
        bleu=scores.bleu,
        edit_similarity=scores.edit_similarity,
        exact_match=scores.exact_match,
        approximately_memorized=scores.approximately_memorized,
        stored_ngrams=0 if censored else found.stored,
        ngrams=0 if censored else found.total,
        stored_text_ngrams=in_text.stored,
        text_ngrams=in_text.total,
        interventions=len(completion.interventions) if defense in GUARDS else 0,
        signature=scores.signature,
        stored_word_ngrams=words.stored if words is not None else None,
        word_ngrams=words.total if words is not None else None,
    )
