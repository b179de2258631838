"""The one table of eval's command lines: which flag sets which settings field. Library errors
name fields (:class:`memfree.errors.SettingError`); ``memfree eval`` and ``memfree audit`` say
them in their flags' names with :func:`in_flags`."""

from __future__ import annotations

import re

from memfree.errors import SettingError, in_flag_terms

#: Each settings field that eval's commands set, and the flag that sets it: fields of
#: :class:`~eval.settings.ExperimentSettings`, :class:`~eval.metrics.MetricSettings` and
#: :class:`~eval.settings.AuditSettings`, and the ``DecodingSettings`` fields eval has flags for
#: (``batch_size``, ``seed``). ``memfree audit``'s options are read back through it too
#: (:data:`eval.cli.audit_options.OPTION_FIELDS`).
FLAGS = {
    "num_examples": "--num-examples",
    "prompt_tokens": "--prompt-tokens",
    "truth_tokens": "--truth-tokens",
    "styles": "--styles",
    "defenses": "--defenses",
    "seed": "--seed",
    "batch_size": "--batch-size",
    "per_bucket": "--per-bucket",
    "text_field": "--text-field",
    "bleu_threshold": "--bleu-threshold",
    "normalize": "--normalize",
    "canary_format": "--format",
    "repetitions": "--repetitions",
    "canaries_per_repetition": "--per-repetition",
    "prompt_lengths": "--prompt-tokens",
    "references": "--references",
    "max_queries": "--max-queries",
}

#: The names ``memfree audit extractable`` still takes its lengths by (k and m in the papers):
#: its parser declares them from here, and audit messages name them beside the flag
#: (``--prompt-tokens (--k)``).
OLD_NAMES = {"--prompt-tokens": "--k", "--truth-tokens": "--m"}

# A quoted value in a message (``got 'x'``): the user's words, never translated.
_QUOTED = re.compile(r"""((?<!\w)'[^'\n]*'(?!\w)|(?<!\w)"[^"\n]*"(?!\w))""")


def flag_terms(*, old_names: bool = False) -> dict[str, str]:
    """:data:`FLAGS`, each flag followed by its old name (:data:`OLD_NAMES`) with
    ``old_names``."""
    if not old_names:
        return dict(FLAGS)
    return {
        field: f"{flag} ({OLD_NAMES[flag]})" if flag in OLD_NAMES else flag
        for field, flag in FLAGS.items()
    }


def in_flags(error: BaseException, *, old_names: bool = False) -> str:
    """An error as the command line says it: a :class:`~memfree.errors.SettingError`'s fields as
    flags (quoted values kept as they are), any other error's own text.

    Args:
        error: the error to report.
        old_names: name the old spelling beside a flag that has one (``memfree audit``).

    Example:
        >>> in_flags(SettingError("num_examples must be an integer >= 1, got 0", "num_examples"))
        '--num-examples must be an integer >= 1, got 0'
    """
    if not isinstance(error, SettingError):
        return str(error)
    terms = flag_terms(old_names=old_names)
    parts = _QUOTED.split(str(error))
    return "".join(
        part if index % 2 else in_flag_terms(part, terms) for index, part in enumerate(parts)
    )


__all__ = ["FLAGS", "OLD_NAMES", "flag_terms", "in_flags"]
