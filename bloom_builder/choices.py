"""The named choices of a build (its unit, executor and output format) as ``Literal`` types, with
the values each takes: checked once where user input enters (:class:`BuildSettings`, the CLI's
``choices``), typed everywhere after.
"""

from __future__ import annotations

from typing import Literal, get_args

#: What an n-gram is made of: token ids, or normalized words (:mod:`memfree.units`).
UnitName = Literal["token", "word"]
#: Where map and reduce tasks run: a local process pool, or Ray Core tasks.
ExecutorName = Literal["local", "ray"]
#: The filter file written: memfree's native format, or pybloomfiltermmap3's (interchange).
OutputFormat = Literal["memfree", "pybloomfiltermmap3"]
#: The native format's layouts: the blocked Bloom filter, or the prefix-keyed index.
LayoutName = Literal["blocked-512", "prefix-index"]

UNITS: tuple[UnitName, ...] = get_args(UnitName)
EXECUTORS: tuple[ExecutorName, ...] = get_args(ExecutorName)
FORMATS: tuple[OutputFormat, ...] = get_args(OutputFormat)
LAYOUTS: tuple[LayoutName, ...] = get_args(LayoutName)

__all__ = [
    "EXECUTORS",
    "FORMATS",
    "LAYOUTS",
    "UNITS",
    "ExecutorName",
    "LayoutName",
    "OutputFormat",
    "UnitName",
]
