"""CUDA availability and device facts for the benches.

Everything here imports on a CPU-only machine: :func:`require_cuda` raises
:class:`CudaUnavailableError` with a clear message, :func:`cuda_or_none` prints it (a command line
then exits 2), and :func:`l2_cache_bytes` falls back to ``DEFAULT_L2_BYTES``.
"""

from __future__ import annotations

import sys

import torch

#: L2 size assumed when the device cannot be asked (H100: 50 MB, H200: 60 MB).
DEFAULT_L2_BYTES = 50 * 1024 * 1024


class CudaUnavailableError(RuntimeError):
    """Raised by the functions that need a CUDA GPU when none is available."""


def require_cuda(what: str = "this benchmark") -> torch.device:
    """Return the current CUDA device, or raise :class:`CudaUnavailableError` if there is none.

    Args:
        what: name of the caller, used in the error message.
    """
    if not torch.cuda.is_available():
        raise CudaUnavailableError(
            f"{what} needs a CUDA GPU, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
            "Run it on the GPU machine."
        )
    return torch.device("cuda", torch.cuda.current_device())


def cuda_or_none(what: str) -> torch.device | None:
    """The CUDA device, or ``None`` after printing ``error: <why>`` to stderr (callers exit 2)."""
    try:
        return require_cuda(what)
    except CudaUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def l2_cache_bytes(device: torch.device | int | None = None) -> int:
    """L2 cache size of ``device`` in bytes (``DEFAULT_L2_BYTES`` when it cannot be read)."""
    if not torch.cuda.is_available():
        return DEFAULT_L2_BYTES
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    size = int(getattr(props, "L2_cache_size", 0) or 0)
    return size if size > 0 else DEFAULT_L2_BYTES


def device_name() -> str:
    """Name of the current CUDA device, or ``"cpu (no CUDA device)"``."""
    if torch.cuda.is_available():
        try:
            return torch.cuda.get_device_name()
        except RuntimeError as exc:
            return f"cuda (name unavailable: {exc})"
    return "cpu (no CUDA device)"
