"""One run's generations, a batch at a time, and the record of each (Ippolito et al. 2023, §5):
each style's prompts are generated once per group of defenses sharing a generation
(:func:`eval.defenses.generation_groups`), each output cut to its truth's length, scored, and
its stored n-grams counted once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from eval.defenses import DEFENSE_NAMES, generation_groups, get_defense, is_guarded
from eval.metrics import MetricSettings, Scores, StoredNgrams, score, stored_ngrams
from eval.records import MemorizationRecord
from eval.resultfiles import RecordLog
from eval.sampling import Example, frequency_bucket
from eval.settings import ExperimentSettings
from eval.styles import apply_style
from memfree.units import TOKEN, WORD


def make_guards(
    settings: ExperimentSettings, tokenizer: Any, ngram_filter: Any, word_filter: Any
) -> dict[str, Any]:
    """The guard of each guarded defense of the run, by name. The token filter's guard is made
    even when no defense generates with it: making it checks that the filter is the tokenizer's,
    which every record's counts rely on."""
    from memfree.engines.transformers import MemFreeLogitsProcessor

    filters = {TOKEN.name: ngram_filter, WORD.name: word_filter}
    guards = {}
    for name in DEFENSE_NAMES:
        unit = get_defense(name).guard_unit
        if unit is not None and (name in settings.defenses or unit is TOKEN):
            guards[name] = MemFreeLogitsProcessor(
                filters[unit.name],
                tokenizer=tokenizer,
                canonical=get_defense(name).canonical if unit.reads_token_ids else None,
            )
    return guards


@dataclass(frozen=True)
class BatchRun:
    """What every batch of one run generates and scores with.

    Attributes:
        model: the causal LM.
        tokenizer: its tokenizer.
        ngram_filter: the corpus's token filter (every record counts its stored n-grams).
        word_filter: the corpus's word filter, or None (then no record counts word n-grams).
        metrics: how outputs are scored.
        decoding: the decoding settings (``max_new_tokens`` is set per batch).
        guards: each guarded defense's guard, by name (:func:`make_guards`).
    """

    model: Any
    tokenizer: Any
    ngram_filter: Any
    word_filter: Any
    metrics: MetricSettings
    decoding: Any
    guards: dict[str, Any]

    def style(
        self,
        examples: Sequence[Example],
        style: str,
        settings: ExperimentSettings,
        log: RecordLog,
        progress: Callable[[int], Any] | None,
    ) -> None:
        """Generate and log every record of ``style`` not yet in ``log``, a batch at a time."""
        styled = [_styled(example, style, self.tokenizer) for example in examples]
        for defense_group in generation_groups(settings.defenses):
            pending = [
                index
                for index, example in enumerate(examples)
                if any((example.example_id, style, d) not in log.done for d in defense_group)
            ]
            for begin in range(0, len(pending), settings.batch_size):
                chunk = pending[begin : begin + settings.batch_size]
                records = self.chunk(examples, styled, style, defense_group, chunk, log.done)
                log.append(record.to_dict() for record in records)
                if progress is not None:
                    progress(len(chunk) * len(defense_group))

    def chunk(
        self,
        examples: Sequence[Example],
        styled: Sequence[tuple[Any, str, tuple[int, ...] | None, int]],
        style: str,
        defense_group: tuple[str, ...],
        chunk: list[int],
        done: set[tuple[str, str, str]],
    ) -> list[MemorizationRecord]:
        """One generate() call for the examples ``chunk`` and a record per defense not done.

        Each record counts the stored n-grams of its own output, cut to its truth's length
        (:func:`_record`: stored and all, in the ids, the text and the words), which
        :attr:`memfree.generation.Completion.stored_ngrams` does not hold; so complete() counts
        nothing (``count_stored=False``) and each output is counted once."""
        from memfree.generation import complete

        guard = next((self.guards[d] for d in defense_group if is_guarded(d)), None)
        # A styled truth may take more tokens than the original: generate enough for the
        # longest, then cut each output to its own truth's length.
        budget = max(styled[i][3] for i in chunk)
        completions = complete(
            self.model,
            self.tokenizer,
            [styled[i][0] for i in chunk],
            replace(self.decoding, max_new_tokens=budget),
            guard,
            count_stored=False,
        )
        records = []
        for index, completion in zip(chunk, completions, strict=True):
            completion = _cut(completion, styled[index][3], self.tokenizer)
            # The defenses of one group share this output: each count is made once for them.
            found = stored_ngrams(self.ngram_filter, completion.prompt_ids, completion.output_ids)
            measured: dict[bool, _Measured] = {}
            for defense in defense_group:
                if (examples[index].example_id, style, defense) in done:
                    continue
                censored = get_defense(defense).censors and found.stored > 0
                if censored not in measured:
                    measured[censored] = self._measure(completion, styled[index], censored)
                records.append(
                    _record(
                        examples[index],
                        style,
                        defense,
                        styled[index],
                        completion,
                        found,
                        measured[censored],
                        self.tokenizer,
                    )
                )
        return records

    def _measure(
        self,
        completion: Any,
        styled: tuple[Any, str, tuple[int, ...] | None, int],
        censored: bool,
    ) -> _Measured:
        """The scores and the counts of an output (of nothing, when ``censored``) in its text
        and, with a word filter, in words."""
        _, truth, truth_ids, _ = styled
        output = "" if censored else completion.text
        output_ids = [] if censored else completion.output_ids
        in_text = stored_ngrams(
            self.ngram_filter, completion.prompt_ids, output_ids, self.tokenizer, text=True
        )
        scores = score(output, truth, self.metrics, output_ids if truth_ids else None, truth_ids)
        words = None
        if self.word_filter is not None:
            words = stored_ngrams(
                self.word_filter, completion.prompt_ids, output_ids, tokenizer=self.tokenizer
            )
        return _Measured(censored, output, scores, in_text, words)


@dataclass(frozen=True)
class _Measured:
    """What a record says of its output beyond the ids' count: shared by the records of one
    output whose defenses withhold it alike."""

    censored: bool
    output: str
    scores: Scores
    in_text: StoredNgrams
    words: StoredNgrams | None


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
    found: StoredNgrams,
    measured: _Measured,
    tokenizer: Any,
) -> MemorizationRecord:
    """The record of one output under one defense."""
    prompt, truth, _, _ = styled
    scores, censored, words = measured.scores, measured.censored, measured.words
    return MemorizationRecord(
        example_id=example.example_id,
        source=example.source,
        occurrences=example.occurrences,
        bucket=frequency_bucket(example.occurrences) if example.occurrences else None,
        style=style,
        defense=defense,
        prompt=prompt if isinstance(prompt, str) else tokenizer.decode(prompt),
        truth=truth,
        output=measured.output,
        censored=censored,
        bleu=scores.bleu,
        edit_similarity=scores.edit_similarity,
        exact_match=scores.exact_match,
        approximately_memorized=scores.approximately_memorized,
        stored_ngrams=0 if censored else found.stored,
        ngrams=0 if censored else found.total,
        stored_text_ngrams=measured.in_text.stored,
        text_ngrams=measured.in_text.total,
        interventions=len(completion.interventions) if is_guarded(defense) else 0,
        signature=scores.signature,
        stored_word_ngrams=words.stored if words is not None else None,
        word_ngrams=words.total if words is not None else None,
    )


__all__ = ["BatchRun", "make_guards"]
