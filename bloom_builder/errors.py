"""The builder's one user-facing error: why a build cannot produce a filter, and what to do."""

from __future__ import annotations


class BuildError(ValueError):
    """The build cannot produce a filter (nothing usable, bad output path, ...).

    The message names the input or path at fault and the fix; ``memfree build`` prints it
    without a traceback.
    """
