"""Interchange with pybloomfiltermmap3 0.6 files: its face.

Everything outside this folder imports from here (``make lint`` holds it):

- :mod:`.reader`: :class:`PybloomNgramFilter`, a strict reader answering the same read
  Protocol as memfree's own layouts;
- :mod:`.layout`: the library's file layout and memfree's ``.json`` sidecar beside it;
- :mod:`.arithmetic`: the library's keys, MurmurHash3 probe positions and sizing, in numpy;
- :mod:`.writer`: a file of token n-grams and its sidecar, sized as the library sizes one.
"""

from __future__ import annotations

from memfree.filterfile.pybloom.arithmetic import expected_false_positive_rate
from memfree.filterfile.pybloom.layout import MAGIC, PybloomHeader
from memfree.filterfile.pybloom.reader import PybloomNgramFilter, open_pybloom, sidecar_path
from memfree.filterfile.pybloom.writer import PybloomWriter

__all__ = [
    "MAGIC",
    "PybloomHeader",
    "PybloomNgramFilter",
    "PybloomWriter",
    "expected_false_positive_rate",
    "open_pybloom",
    "sidecar_path",
]
