"""Compile cache for the CuTeDSL kernels: in memory, then on disk, then ``cute.compile``.

Kernels are compiled once per *static* key (kernel name, arch, the compile-time choices such as
layout or dtype, and the config) from fake tensors with symbolic sizes, so row counts and offsets
never trigger a compile (K and group counts only where they move to a shape class with another
config: the FP8 kernels' tuned tables). A compiled kernel is exported as an object file into
``CUTE_KERNELS_CACHE_DIR`` (default ``~/.cache/cute_kernels``; set ``CUTE_KERNELS_DISK_CACHE=0`` to
disable) under a name that hashes the key, the package and DSL versions and the source of
``cute_kernels`` and ``cute_utils``; a new process loads it in milliseconds instead of tracing and
compiling again. Loaded kernels are TVM-FFI functions: they take torch tensors directly and launch
on the current CUDA stream.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_PACKAGE_VERSION = "0.1.0"
_SOURCE_PACKAGES = ("cute_kernels", "cute_utils")


@dataclass
class CompileStats:
    """Counters tests and benchmarks read: real compiles, disk loads, and their wall times (s)."""

    compiles: int = 0
    disk_loads: int = 0
    compile_seconds: list[float] = field(default_factory=list)
    load_seconds: list[float] = field(default_factory=list)


STATS = CompileStats()
_memory: dict[tuple, Callable] = {}
_lock = threading.Lock()
_fingerprint: str | None = None


def cache_dir() -> Path | None:
    """Directory of the disk cache, or ``None`` when disabled."""
    if os.environ.get("CUTE_KERNELS_DISK_CACHE", "1") == "0":
        return None
    root = os.environ.get("CUTE_KERNELS_CACHE_DIR") or os.path.join(Path.home(), ".cache", "cute_kernels")
    return Path(root)


def _source_fingerprint() -> str:
    """Hash of the versions and every kernel source file: any edit invalidates the disk cache."""
    global _fingerprint
    if _fingerprint is None:
        import cutlass

        digest = hashlib.sha256(f"{_PACKAGE_VERSION}|{cutlass.__version__}|{sys.version_info[:2]}".encode())
        root = Path(__file__).resolve().parent.parent
        for package in _SOURCE_PACKAGES:  # every module, subpackages (configs/, experimental/) too
            for path in sorted((root / package).rglob("*.py")):
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
        _fingerprint = digest.hexdigest()
    return _fingerprint


def _symbol(key: tuple) -> str:
    digest = hashlib.sha256(f"{_source_fingerprint()}|{key!r}".encode()).hexdigest()[:24]
    return f"cute_kernels_{digest}"


def _load(path: Path, symbol: str) -> Callable:
    import cutlass.cute as cute

    return getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), symbol)


def _export(compiled, directory: Path, symbol: str) -> None:
    """Write the object file atomically (concurrent processes may race on the same key)."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".o.tmp")
    os.close(fd)
    try:
        compiled.export_to_c(tmp, function_name=symbol)
        os.replace(tmp, directory / f"{symbol}.o")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def get_kernel(key: tuple, build: Callable[[], object]) -> Callable:
    """Return the TVM-FFI callable for ``key``, building it with ``build()`` only on a full miss.

    ``key`` must hold only static properties (kernel name, arch, compile-time options); ``build``
    returns a ``cute.compile`` result compiled with ``--enable-tvm-ffi``.
    """
    kernel = _memory.get(key)
    if kernel is not None:
        return kernel
    with _lock:
        kernel = _memory.get(key)
        if kernel is None:
            kernel = _load_or_build(key, build)
            _memory[key] = kernel
    return kernel


def _load_or_build(key: tuple, build: Callable[[], object]) -> Callable:
    directory = cache_dir()
    symbol = _symbol(key)
    path = directory / f"{symbol}.o" if directory is not None else None
    if path is not None and path.exists():
        start = time.perf_counter()
        try:
            kernel = _load(path, symbol)
        except Exception as error:  # a truncated or foreign file: rebuild rather than fail
            print(f"cute_kernels: ignoring unreadable cache entry {path}: {error}", file=sys.stderr)
        else:
            STATS.disk_loads += 1
            STATS.load_seconds.append(time.perf_counter() - start)
            return kernel
    start = time.perf_counter()
    compiled = build()
    STATS.compiles += 1
    STATS.compile_seconds.append(time.perf_counter() - start)
    if path is not None:
        _export(compiled, directory, symbol)
    return compiled


_clear_hooks: list[Callable[[], None]] = []


def on_clear(hook: Callable[[], None]) -> None:
    """Register a callback that drops a module's own kernel lookup table on :func:`clear_memory_cache`."""
    _clear_hooks.append(hook)


def clear_memory_cache() -> None:
    """Forget in-process kernels (the disk cache stays): the next call loads or compiles again."""
    with _lock:
        _memory.clear()
        for hook in _clear_hooks:
            hook()
