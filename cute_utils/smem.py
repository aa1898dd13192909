"""A CTA's shared memory as a ``@cute.struct`` built from a table of fields."""

import cutlass.cute as cute


def storage_struct(fields: dict) -> type:
    """A ``@cute.struct`` named ``SharedStorage`` whose members are ``fields`` in order (``{name:
    cute.struct.MemRange[...] or cute.struct.Align[...]}``): for layouts whose members depend on
    the variant, which a class body cannot express."""
    return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))
