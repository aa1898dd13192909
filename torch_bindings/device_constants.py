"""Small read-only device tensors built once and reused across calls (lookup tables, index vectors,
address tables), without a host sync and safe across streams and CUDA graph captures.

A tensor is built on the current stream the first time its key is asked for. Until the build is
known to be done (an event query, no sync), a call on another stream makes that stream wait for it
on the device. Inside a CUDA graph capture no event can be queried: a tensor built before the
capture is taken as built (``torch.cuda.graph`` and ``make_graphed_callables`` synchronize the device
before they capture), and a tensor first needed inside a capture is built into the graph and returned
without being cached (its bytes exist only once the graph replays, and the graph's memory must not
serve calls outside it).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

__all__ = ["ConstantCache", "capturing"]


def capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is capturing a CUDA graph (False off CUDA)."""
    if device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _built_event(device: torch.device) -> torch.cuda.Event | None:
    """An event recorded on ``device``'s current stream (None off CUDA)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class _Entry:
    """A cached tensor and, until its build is known to be done, the event recorded after it."""

    __slots__ = ("pending", "tensor")

    def __init__(self, tensor: torch.Tensor, pending: torch.cuda.Event | None) -> None:
        self.tensor = tensor
        self.pending = pending


class ConstantCache:
    """Tensors by key (module docstring). Entries are never dropped: a CUDA graph captured after a
    lookup, or a kernel queued on another stream, may read a cached tensor at any later time.
    ``limit``: past this many entries a new key's tensor is built and returned without being cached
    (as inside a capture), so the cache's memory stays bounded (None: no limit). The tensors are
    read only: none may be written, nor handed out other than as a view that cannot be written
    (a zero-stride expansion autograd owns)."""

    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"ConstantCache: limit must be None or >= 1, got {limit}")
        self._entries: dict[Hashable, _Entry] = {}
        self._limit = limit

    def get(
        self,
        key: Hashable,
        device: torch.device,
        build: Callable[[], torch.Tensor],
        on_captured_build: Callable[[torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """The tensor of ``key`` on ``device``, ``build()`` on the current stream the first time.
        ``on_captured_build(tensor)`` runs when the build happened inside a CUDA graph capture (the
        tensor is then not cached: keep it alive there, warn)."""
        entry = self._entries.get(key)
        if entry is not None and entry.pending is None:
            return entry.tensor
        inside = capturing(device)
        if entry is None:
            tensor = build()
            if inside:
                if on_captured_build is not None:
                    on_captured_build(tensor)
                return tensor
            if self._limit is None or len(self._entries) < self._limit:
                self._entries[key] = _Entry(tensor, _built_event(device))
            return tensor
        if inside or entry.pending.query():
            entry.pending = None
        else:
            torch.cuda.current_stream(device).wait_event(entry.pending)
        return entry.tensor

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def pending(self, key: Hashable) -> bool:
        """Whether the cached build of ``key`` is not yet known to be done (KeyError: not cached)."""
        return self._entries[key].pending is not None

    def clear(self) -> None:
        """Drop every entry (tests)."""
        self._entries.clear()
