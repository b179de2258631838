"""``memfree.filter``: the filter reader's public path (``NgramFilter``, ``NgramSet``).

The file format lives in :mod:`memfree.filterfile`; this module keeps the path stable.
"""

from __future__ import annotations

from memfree.filterfile import NgramFilter, open_filter
from memfree.filterfile.protocol import BlockedBits, NgramSet

__all__ = ["BlockedBits", "NgramFilter", "NgramSet", "open_filter"]
