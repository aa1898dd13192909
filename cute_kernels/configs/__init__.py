"""Launch configs per GPU arch: ``sm90`` (Hopper) and ``sm100`` (Blackwell), one function per kernel
(named as in ``cute_kernels.registry``) taking the variant and returning its config, each choice
with a one-line reason and the note that measured it."""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {"sm_90a": "sm90", "sm_100a": "sm100"}


def pick(kernel: str, variant: Any, arch: str) -> Any:
    """The config of ``kernel``'s ``variant`` on ``arch`` (``"sm_90a"`` or ``"sm_100a"``)."""
    if arch not in _MODULES:
        raise ValueError(f"no configs for arch {arch!r} (known: {', '.join(_MODULES)})")
    module = importlib.import_module(f"{__name__}.{_MODULES[arch]}")
    return getattr(module, kernel)(variant)
