"""Exceptions users can act on: each names the input, the problem and the fix."""

from __future__ import annotations

import errno


class FilterError(ValueError):
    """A filter file cannot be used as asked."""


class DamagedFilterError(FilterError):
    """A filter file is truncated, corrupted, of an unknown version or not a filter at all."""


class FilterChangedError(DamagedFilterError):
    """A filter file was rewritten in place while a guard had it mapped (see
    :mod:`memfree.filterfile.filewatch`): the guard stops rather than read bits it did not verify."""


class FilterMismatchError(FilterError):
    """A filter was built for another tokenizer or another n-gram size than it is used with."""


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
