"""Warnings a process gives once per key: a slower path taken, or a default with an effect the
caller may not expect (no silent slow path, and no repeated noise in a training loop)."""

from __future__ import annotations

import warnings
from collections.abc import Hashable

#: The keys warned about in this process.
_given: set[Hashable] = set()


def warn_once(key: Hashable, message: str, stacklevel: int = 2) -> bool:
    """Warn ``message`` (a ``UserWarning``) the first time this process meets ``key``; ``stacklevel``
    counts from the caller, as ``warnings.warn``'s does. Returns whether it warned."""
    if key in _given:
        return False
    _given.add(key)
    warnings.warn(message, stacklevel=stacklevel + 1)
    return True


def forget(key: Hashable) -> None:
    """Warn about ``key`` again on its next meeting (tests)."""
    _given.discard(key)
