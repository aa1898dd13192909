"""The one path every public op takes: check -> backend -> cached kernel -> launch.

An op declares a :class:`KernelOp` (its name, checks, kernel runner, reference, custom op and
eager fast path) and its public function calls it. Eager calls on a device where a kernel already
ran go to the op's ``fast``, which checks the arguments in a few metadata reads and launches, or
declines; everything else (and whatever ``fast`` declines) runs the full checks (which raise the
clear errors), picks the backend, and under ``torch.compile`` goes through the op's
``torch.library`` custom op so the graph holds one opaque node with a fake. Host overhead: see
notes/host-overhead.md.

``torch.compile`` of an op is a GPU feature: the graph holds the kernel's custom op. Where the
reference runs (CPU tensors, ``backend="reference"``), Inductor cannot compile it (its
``float8_e8m0fnu`` outputs, its data-dependent offset checks), so under ``torch.compile`` the
reference runs eagerly outside the graph (a graph break), and ``fullgraph=True`` raises dynamo's
``Unsupported`` error carrying that reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from . import targets

_TARGETS = targets._targets  # device index -> DeviceTarget (the dict object never changes)
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling  # the function dynamo folds to True while tracing


def _decline(target: Any, args: tuple) -> None:
    return None


def _outside_graph(name: str, reference: Callable[..., Any]) -> Callable[..., Any]:
    """``reference`` wrapped with ``torch.compiler.disable``, its reason naming the op ``name``."""
    reason = (
        f"{name}: torch.compile of the cute_kernels ops is a GPU feature (the graph holds the CuTeDSL "
        "kernel's custom op, on a CUDA tensor of an sm_90/sm_100 GPU); on CPU, on a GPU the kernels "
        "do not support, or with backend='reference', the PyTorch reference runs eagerly outside "
        "the graph, so fullgraph=True cannot compile it. Call the op eagerly there (same bytes)."
    )
    return torch.compiler.disable(reference, reason=reason)


@dataclass(frozen=True)
class KernelOp:
    """A public op's parts; all take the op's positional arguments (``args``), tensor first:

    - ``check(*args)``: the contract's checks (raise ``TypeError`` / ``ValueError``);
    - ``run(target, *args)``: the kernel path on ``targets.DeviceTarget`` ``target`` (allocates the
      outputs, launches once, returns them);
    - ``reference(*args)``: ``torch_bindings.reference``'s implementation;
    - ``custom_op(*args)``: the ``torch.library`` op that calls ``run`` (``torch.compile`` path);
    - ``fast(target, args)``: the eager fast path, called with the ``args`` tuple itself (no star
      call: cheaper, notes/host-overhead.md) and ``args[0]`` a tensor on ``target``'s device: the outputs of
      ``run(target, *args)``, or ``None`` (nothing launched) unless ``check``
      and ``run``'s kernel-path checks surely pass, judged from metadata reads only, or left to the
      TVM-FFI wrapper of a kernel it surely launches (each tensor's device, rank, alignment and
      constant strides, and sizes shared between arguments, checked before the launch; not the
      outer strides of a tensor: those are free symbols there). It may raise ``TypeError``,
      ``ValueError`` or ``RuntimeError`` (a wrapper's refusal, or a kernel-path limit such as the
      expert count): :meth:`dispatch` then runs the full path, which raises the contract's error.
    """

    name: str
    check: Callable[..., None]
    run: Callable[..., Any]
    reference: Callable[..., Any]
    custom_op: Callable[..., Any]
    fast: Callable[..., Any] = _decline
    #: ``reference`` as ``torch.compile`` meets it: run eagerly, outside the graph (module docstring).
    reference_outside_graph: Callable[..., Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reference_outside_graph", _outside_graph(self.name, self.reference))

    def dispatch(self, backend: str, *args: Any) -> Any:
        """Run the op on ``args`` with ``backend`` (a method with positional arguments: the fastest
        call Python has, cheaper than ``__call__`` with a keyword: notes/host-overhead.md)."""
        compiling = _is_compiling()  # first: dynamo must not guard on the tables
        if not compiling and (backend == "auto" or backend == "cute") and isinstance(args[0], _Tensor):
            target = _TARGETS.get(args[0].get_device())  # targets.known, inlined (hot path)
            if target is not None:  # eager fast path
                try:
                    out = self.fast(target, args)
                except (TypeError, ValueError, RuntimeError):
                    out = None  # a kernel's wrapper refused an argument: the full checks say why
                if out is not None:
                    return out
        self.check(*args)
        target = targets.select(self.name, backend, args[0])
        if target is None:
            return self.reference_outside_graph(*args) if compiling else self.reference(*args)
        if compiling:
            return self.custom_op(*args)
        return self.run(target, *args)

    def run_on_device(self, *args: Any) -> Any:
        """Body of the op's custom op: ``run`` on the kernel target of ``args[0]``'s device."""
        return self.run(targets.select(self.name, "cute", args[0]), *args)
