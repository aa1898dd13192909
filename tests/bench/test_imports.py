"""Every name the bench scripts import from the project's packages exists: the scripts import
lazily inside functions (a GPU is needed to run them), so a renamed helper would otherwise surface
only on a GPU run."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bench", "cute_kernels", "cute_utils", "torch_bindings")


def _imports() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] in PACKAGES:
                    found += [(str(path.relative_to(ROOT)), node.module, a.name) for a in node.names]
    return found


@pytest.mark.parametrize("where, module, name", _imports(), ids=lambda v: str(v))
def test_bench_import_exists(where, module, name):
    if module.split(".")[0] in ("cute_kernels", "cute_utils"):
        pytest.importorskip("cutlass")
    mod = importlib.import_module(module)
    if not hasattr(mod, name):
        importlib.import_module(f"{module}.{name}")  # a submodule: raises if missing
