"""The wheel ships every package of the library: pyproject's package list names each folder with an
``__init__.py`` under cute_utils, cute_kernels and torch_bindings (an editable install would hide a
missing one)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[2]


def test_every_library_package_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("cute_utils", "cute_kernels", "torch_bindings")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert listed == found
