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
from pathlib import Path
from typing import Any

from eval.batches import BatchRun, make_guards
from eval.defenses import get_defense
from eval.records import MemorizationRecord, MemorizationResults
from eval.resultdirs import claim_results_dir
from eval.resultfiles import RecordLog, read_examples, read_settings_fingerprint, write_examples
from eval.sampling import Example, sample_examples
from eval.settings import ExperimentSettings, settings_fingerprint
from memfree.fileio import atomic_write
from memfree.units import TOKEN, WORD


def check_filters(ngram_filter: Any, word_filter: Any = None) -> None:
    """Refuse a filter of the other unit given as the token filter (``--filter``) or the word
    filter (``--word-filter``); the command line calls this before it loads the model.

    Raises:
        ValueError: naming the file, what it is, and what the option takes.
    """
    if ngram_filter is not None and ngram_filter.unit != TOKEN.name:
        raise ValueError(
            f"{ngram_filter.path}: a {ngram_filter.unit} filter given as the token filter "
            "(--filter); pass it as the word filter (--word-filter) and the corpus's token filter "
            "as --filter"
        )
    if word_filter is not None and word_filter.unit != WORD.name:
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
        word_filter: the corpus's word filter (``memfree build --unit word``): the guard of a
            defense that needs it (:attr:`eval.defenses.Defense.needs_word_filter`); when given,
            every record also counts the stored word n-grams of its output.
        overwrite: write into a non-empty ``out_dir`` that holds no eval results (``--force``).

    Raises:
        ValueError: a defense that needs a word filter without one, a filter of the wrong unit,
            or a corpus without ``settings.num_examples`` documents long enough.
        eval.resultfiles.ResultFileError: a result file in ``out_dir`` is damaged or holds
            another run's or a duplicate record (the message names the file, the line and the
            fix).
        eval.resultdirs.ResultsDirError: ``out_dir`` is another kind of folder, or another run
            holds its lock.
    """
    check_filters(ngram_filter, word_filter)
    for name in settings.defenses:
        if get_defense(name).needs_word_filter and word_filter is None:
            raise ValueError(
                f"the {name!r} defense needs a word filter (memfree build CORPUS --unit word); "
                "give it with --word-filter"
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
    from memfree.generation import DecodingSettings

    recorded = _recorded_settings(out, settings, model_name, ngram_filter, word_filter)
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
    guards = make_guards(settings, tokenizer, ngram_filter, word_filter)
    run = BatchRun(model, tokenizer, ngram_filter, word_filter, settings.metrics, decoding, guards)
    for style in settings.styles:
        run.style(examples, style, settings, log, progress)
    return MemorizationResults(
        tuple(MemorizationRecord.from_dict(record) for record in log.records),
        recorded,
        recorded["fingerprint"],
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
