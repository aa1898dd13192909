"""How every kernel module compiles its launcher: ``cute.compile`` with TVM-FFI for one GPU arch."""

import cutlass.cute as cute


def compile_tvm_ffi(launch, fake_args, arch: str, options: str = ""):
    """``cute.compile(launch, *fake_args)`` for ``arch`` (e.g. ``"sm_90a"``) with ``--enable-tvm-ffi``
    (the result is called with torch tensors on the env stream); ``options`` are appended (e.g.
    :func:`cute_utils.sass.compile_options` to keep the cubin)."""
    return cute.compile(launch, *fake_args, options=f"--enable-tvm-ffi --gpu-arch {arch} {options}".strip())
