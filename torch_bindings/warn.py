"""Warnings a process gives once per key: a slower path taken, or a default with an effect the
caller may not expect (no silent slow path, and no repeated noise in a training loop)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Hashable

import torch

#: The keys warned about in this process, and the lock that makes each warn once across threads.
_given: set[Hashable] = set()
_lock = threading.Lock()


def warn_once(key: Hashable, message: str, stacklevel: int = 2) -> bool:
    """Warn ``message`` (a ``UserWarning``) the first time this process meets ``key``; ``stacklevel``
    counts from the caller, as ``warnings.warn``'s does. Returns whether it warned. Silent while
    ``torch.compile`` traces (the key set would become a guard of the compiled code, and a warning
    raised while tracing points at no caller's line): the eager calls warn."""
    if torch.compiler.is_compiling():
        return False
    with _lock:
        if key in _given:
            return False
        _given.add(key)
    warnings.warn(message, stacklevel=stacklevel + 1)
    return True


def forget(key: Hashable) -> None:
    """Warn about ``key`` again on its next meeting (tests)."""
    _given.discard(key)
