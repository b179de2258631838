"""Exceptions users can act on: each names the input, the problem and the fix."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping


class FilterError(ValueError):
    """A filter file cannot be used as asked."""


class DamagedFilterError(FilterError):
    """A filter file is truncated, corrupted, of an unknown version or not a filter at all."""


class FilterChangedError(DamagedFilterError):
    """A filter file was rewritten in place while a guard had it mapped (see
    :mod:`memfree.filterfile.filewatch`): the guard stops rather than read bits it did not verify."""


class FilterMismatchError(FilterError):
    """A filter was built for another tokenizer or another n-gram size than it is used with."""


class EmptyFilterError(FilterError):
    """A filter that stores no n-gram (``path``, of ``unit`` ``n``-grams) was given to a guard,
    which would then guard nothing; ``opt_in`` says how the caller accepts one anyway."""

    def __init__(self, path: str | os.PathLike[str], unit: str, n: int, opt_in: str) -> None:
        super().__init__(
            f"{path}: the filter stores no n-gram (0 {unit} {n}-grams), so a guard over it "
            "would guard nothing; rebuild it with a lower --n or --min-count (`memfree build`, "
            f"or from more text), or, if an empty filter is what you want, {opt_in}"
        )
        self.path = path
        self.unit = unit
        self.n = n


class UnsupportedTokenizerError(FilterError):
    """The tokenizer's decoder is not one whose token bytes memfree can read exactly."""


class CanonicalUnsupportedError(UnsupportedTokenizerError):
    """Canonical decoding is not exact for this tokenizer, so it is refused."""


class TokenizerNotFoundError(FileNotFoundError):
    """A tokenizer (or the default model's GGUF file) is not available locally."""


class ModelNotFoundError(FileNotFoundError):
    """No loadable causal language model under the given name."""


class GuardStepError(RuntimeError):
    """A guarded step failed inside llama.cpp's sampler; that step allowed only end of sequence."""


class StorageError(OSError):
    """An object store failed after its client's own retries (a connection refused or reset, a
    timeout, a server error): the message names the URL and what was being done. Nothing is
    lost: rerun (a build keeps its finished tasks)."""


class MissingDependencyError(ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


def require(module: str, extra: str) -> None:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the pip extra."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(
            f"this feature needs the '{module}' package: pip install 'memfree[{extra}]'"
        ) from None


def os_problem(error: OSError) -> str:
    """What an OSError says about its path, in words: "is a directory", "is a symbolic link
    loop", "no such file", else the system's own phrase ("permission denied", ...)."""
    if error.errno == errno.ELOOP:
        return "is a symbolic link loop"
    if error.errno == errno.EISDIR:
        return "is a directory"
    if error.errno == errno.ENOENT:
        return "no such file"
    reason = error.strerror or str(error)
    return reason[:1].lower() + reason[1:]


class SettingError(ValueError):
    """A setting's value is out of range: the message names the field and the value
    (``ngram_size must be >= 1, got 0``), in the library's terms. Each command line translates
    the field names to its flags with :func:`in_flag_terms`."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ServingConfigError(SettingError):
    """The engine's memfree configuration is missing or wrong (a setting, not a filter)."""


def in_flag_terms(message: str, flags: Mapping[str, str]) -> str:
    """A library message in a command line's words: each field name that ``flags`` maps
    (``{"max_new_tokens": "--max-new-tokens"}``) is replaced by its flag, wherever it stands
    as a whole name (not inside another name, a path or a flag)."""
    if not flags:
        return message
    names = sorted(flags, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(map(re.escape, names)) + r")(?![\w/-])")
    return pattern.sub(lambda match: flags[match.group(1)], message)
