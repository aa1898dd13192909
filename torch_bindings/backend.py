"""Which implementation runs a call: the CuTeDSL kernels or the PyTorch reference.

``backend="auto"`` runs the kernel on a CUDA tensor of a supported GPU (sm_90 Hopper, sm_100
Blackwell) and the reference on CPU tensors. On a CUDA tensor where the kernel cannot run (the DSL
package missing or broken, another GPU architecture) ``"auto"`` raises, naming what is missing: the
reference is a slow path that may synchronize the host, so it runs on a GPU only when asked for
(``backend="reference"``). ``"cute"`` insists on the kernel everywhere (CPU tensors included).
"""

from __future__ import annotations

import warnings

import torch

from .warn import user_stacklevel

BACKENDS = ("auto", "cute", "reference")
_ARCH_BY_MAJOR = {9: "sm_90a", 10: "sm_100a"}
# Plain dicts rather than functools.cache: dynamo traces through these under torch.compile.
_dsl_error: dict[str, str | None] = {}
_arch_by_index: dict[int, str | None] = {}


def _dsl_import_error() -> str | None:
    if "error" not in _dsl_error:
        try:
            import cutlass.cute  # noqa: F401
        except Exception as error:  # ImportError, or a broken install raising anything else
            _dsl_error["error"] = f"nvidia-cutlass-dsl is not importable ({type(error).__name__}: {error})"
        else:
            _dsl_error["error"] = None
    return _dsl_error["error"]


def _device_arch(index: int) -> str | None:
    if index not in _arch_by_index:
        major, _ = torch.cuda.get_device_capability(index)
        _arch_by_index[index] = _ARCH_BY_MAJOR.get(major)
    return _arch_by_index[index]


def cuda_index(device: torch.device) -> int:
    """The index of CUDA ``device``: its own, or the current device's for ``torch.device("cuda")``."""
    return device.index if device.index is not None else torch.cuda.current_device()


def kernel_arch(device: torch.device) -> tuple[str | None, str]:
    """``(arch, reason)``: the compile target for ``device``, or ``None`` and why not."""
    if device.type != "cuda":
        return None, f"tensors are on {device.type}, the kernels need a CUDA device"
    index = cuda_index(device)
    arch = _device_arch(index)
    if arch is None:
        capability = torch.cuda.get_device_capability(index)
        return None, f"GPU capability {capability} is not supported (sm_90 or sm_100 required)"
    error = _dsl_import_error()
    if error is not None:
        return None, error
    return arch, ""


def select(op: str, backend: str, device: torch.device) -> str | None:
    """The arch to compile for when the kernel runs, ``None`` when the reference runs."""
    if backend == "reference":
        return None
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {BACKENDS}, got {backend!r}")
    arch, reason = kernel_arch(device)
    if arch is None and (backend == "cute" or device.type == "cuda"):
        raise RuntimeError(unavailable_message(op, backend, reason))
    return arch


def unavailable_message(op: str, backend: str, reason: str) -> str:
    """The error of a kernel path that cannot run: what is missing and how to ask for the reference."""
    return (
        f"{op}: backend={backend!r} cannot run here: {reason}, and the CuTeDSL kernel is needed. "
        "Pass backend='reference' to run the PyTorch reference explicitly (slow; it may synchronize "
        "the host), or see torch_bindings.capabilities(device)."
    )


_sms_by_index: dict[int, int] = {}


def num_sms(index: int) -> int:
    """Multiprocessor count of CUDA device ``index`` (cached): sizes the persistent grids."""
    sms = _sms_by_index.get(index)
    if sms is None:
        sms = _sms_by_index[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return sms


_resident_by_cluster: dict[tuple[int, int], int] = {}


def resident_ctas(index: int, cluster: int) -> int:
    """CTAs of ``cluster``-CTA clusters that CUDA device ``index`` holds at once, at one CTA per SM
    (cached): the persistent grid of a clustered kernel. ``num_sms`` for ``cluster`` = 1; else
    ``cluster`` x the driver's count of co-resident clusters (``cuOccupancyMaxActiveClusters``
    through ``cutlass.utils.HardwareInfo``, asked once per device and size), which can be fewer
    than ``num_sms / cluster`` where a GPC's SM count is not a multiple of the cluster size. A
    grid past it would leave clusters waiting for others to finish: a persistent kernel's slow
    tail."""
    if cluster == 1:
        return num_sms(index)
    key = (index, cluster)
    ctas = _resident_by_cluster.get(key)
    if ctas is None:
        ctas = _resident_by_cluster[key] = _ask_resident_ctas(index, cluster)
    return ctas


def _ask_resident_ctas(index: int, cluster: int) -> int:
    """:func:`resident_ctas` from the driver (a dummy kernel's occupancy at one CTA per SM, compiled
    once per process). ``RuntimeError`` if no cluster of this size fits; where the driver cannot
    be asked, a warning and the SM count rounded down to whole clusters (correct, but clusters
    past the resident ones wait for others to finish)."""
    sms = num_sms(index)
    try:
        from cutlass.utils import HardwareInfo

        with torch.cuda.device(index):
            clusters = HardwareInfo(index).get_max_active_clusters(cluster)
    except Exception as exc:  # noqa: BLE001 - any failure of the query: warn, and the safe grid
        warnings.warn(
            f"could not ask the driver how many {cluster}-CTA clusters device {index} holds "
            f"({type(exc).__name__}: {exc}); the persistent grid is the SM count rounded down to "
            "whole clusters, which may be slower if fewer are resident",
            stacklevel=user_stacklevel(),
        )
        return sms - sms % cluster
    if clusters < 1:
        raise RuntimeError(f"device {index} holds no cluster of {cluster} CTAs at one CTA per SM")
    return min(sms - sms % cluster, cluster * clusters)
