"""Warnings a process gives once per key: a slower path taken, or a default with an effect the
caller may not expect (no silent slow path, and no repeated noise in a training loop)."""

from __future__ import annotations

import functools
import inspect
import os
import threading
import warnings
from collections.abc import Hashable

import torch

#: The keys warned about in this process, and the lock that makes each warn once across threads.
_given: set[Hashable] = set()
_lock = threading.Lock()

_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
#: Source directories a warning never points into: the project's packages and torch (its module
#: call and autograd machinery sits between a user's line and the library).
LIBRARY_DIRS = tuple(
    os.path.normcase(os.path.join(path, ""))
    for path in (
        *(os.path.join(_ROOT, name) for name in ("torch_bindings", "cute_kernels", "cute_utils")),
        os.path.dirname(os.path.realpath(torch.__file__)),
    )
)


@functools.lru_cache(maxsize=512)
def _in_library(filename: str) -> bool:
    """Whether source file ``filename`` lies under :data:`LIBRARY_DIRS`; pseudo-files (``<string>``,
    generated code) and paths that cannot be resolved are the user's."""
    if not os.path.isabs(filename):
        return False
    try:
        return os.path.normcase(os.path.realpath(filename)).startswith(LIBRARY_DIRS)
    except (OSError, RuntimeError, ValueError):
        return False


def user_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel``, as its caller would pass it, of the innermost frame outside
    :data:`LIBRARY_DIRS`: the line of the user's code that called into the library, however deep
    the library's own calls (or torch's ``nn.Module`` and autograd frames) are. A stack with no such
    frame (autograd's device threads run a backward with only torch's and the library's frames)
    gives its outermost frame. Under ``torch.compile`` the user's code is the compiled graph's."""
    frame = inspect.currentframe()
    frame = frame.f_back if frame is not None else None  # the caller: stacklevel 1
    level = 1
    while frame is not None and _in_library(frame.f_code.co_filename):
        if frame.f_back is None:
            return level  # no frame outside the library: the outermost one
        frame = frame.f_back
        level += 1
    return level


def warn_once(key: Hashable, message: str, stacklevel: int | None = None) -> bool:
    """Warn ``message`` (a ``UserWarning``) the first time this process meets ``key``, pointing at
    the user's line (:func:`user_stacklevel`), or with ``stacklevel`` counted from the caller as
    ``warnings.warn``'s is. Returns whether it warned. Silent while ``torch.compile`` traces (the key
    set would become a guard of the compiled code, and a warning raised while tracing points at no
    caller's line): the eager calls warn."""
    if torch.compiler.is_compiling():
        return False
    with _lock:
        if key in _given:
            return False
        _given.add(key)
    # user_stacklevel() counts this function as 1, as warnings.warn does when called here
    warnings.warn(message, stacklevel=user_stacklevel() if stacklevel is None else stacklevel + 1)
    return True


def forget(key: Hashable) -> None:
    """Warn about ``key`` again on its next meeting (tests)."""
    _given.discard(key)
