"""Every bench, tune and calibrate script, without a CUDA GPU: exit code 2 and its one-line message
on stderr, no traceback (bench/README.md; `make bench` runs through on a CPU machine). The demo is
not among them: it runs the reference on CPU."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(
    p.stem for p in [*BENCH.glob("bench_*.py"), *BENCH.glob("tune_*.py"), BENCH / "calibrate_model.py"]
)


def test_every_script_is_listed() -> None:
    assert "bench_overhead" in SCRIPTS and "tune_swizzle" in SCRIPTS and "calibrate_model" in SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_without_gpu_exits_2_with_one_line(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(f"bench.{name}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert module.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and name in lines[0], err
