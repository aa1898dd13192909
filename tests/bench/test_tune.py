"""The tuner driver (``python -m bench.tune KERNEL``) on CPU: run as a module it exits 2 without a
GPU (every target in-process: test_bench_no_gpu.py), every kernel's declared config space is well
formed, and the sweep ranks and writes the tuned table (``bench.common.tuning``, driven here by a
fake compiler and timer)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import tune
from bench.common.tuning import Case, Harness, sweep, winners, write_winners

ROOT = Path(__file__).resolve().parents[2]


def test_module_entry_point_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    run = subprocess.run(
        [sys.executable, "-m", "bench.tune", "swizzle", "--quick"], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "needs a CUDA GPU" in run.stderr
    assert "Traceback" not in run.stderr


def test_write_only_for_the_tabled_kernels(capsys):
    assert tune.main(["swizzle", "--write"]) == 2
    assert "configs/sm90.py" in capsys.readouterr().err


def test_unknown_kernel():
    with pytest.raises(SystemExit):
        tune.parser().parse_args(["nope"])


def test_config_spaces_are_declared():
    pytest.importorskip("cutlass")
    from cute_kernels import registry
    from cute_kernels.configs import sm90, spaces

    tuned = {k for kernels in tune.TARGETS.values() for k in kernels}
    assert tuned == set(spaces.tunable())
    for kernel in spaces.tunable():
        declared = spaces.spaces(kernel)
        assert spaces.DEFAULT in declared, kernel
        config_type = type(getattr(sm90, kernel)(registry.entry(kernel).variants()[0]))
        for name, configs in declared.items():
            assert configs and all(type(c) is config_type for c in configs), (kernel, name)
            assert len(set(configs)) == len(configs), (kernel, name)  # no candidate twice
        if "quick" in declared:
            assert set(declared["quick"]) <= set(declared[spaces.DEFAULT]), kernel
            assert spaces.space(kernel, quick=True) == declared["quick"]
        assert spaces.space(kernel) == declared[spaces.DEFAULT]
    with pytest.raises(KeyError, match="no config space 'nope'"):
        spaces.space("pad", "nope")
    with pytest.raises(KeyError, match="no config space for kernel"):
        spaces.spaces("ep_route")


def test_the_32x1_groups_space():
    args = tune.parser().parse_args(["quantize_32x1", "--groups", "8"])
    assert tune._space_name(args) == "groups"
    assert tune._space_name(tune.parser().parse_args(["quantize_32x1"])) == "default"


@dataclass(frozen=True)
class _Config:
    threads: int
    unroll: int


#: Fake microseconds per config, per case: (128, 1) is fastest on the small case, (256, 2) has the
#: best worst ratio over both cases of the class; (512, 4) writes other bytes.
_US = {
    "small": {_Config(128, 1): 1.0, _Config(256, 2): 1.2, _Config(512, 4): 3.0},
    "large": {_Config(128, 1): 8.0, _Config(256, 2): 4.0, _Config(512, 4): 3.0},
}


def _fake_case(label: str, shape_class: str) -> Case:
    def run(name, kernel, out):
        out[:] = [7] if kernel.threads < 512 else [8]  # the bytes a config writes
        return _US[label][kernel]

    return Case(
        label,
        ("fake",),
        "variant",
        lambda: ([0],),
        run,
        lambda name, args: (args[0],),
        lambda name: 4.0,  # "bytes" moved: the copy takes 4 us (copy_us = nbytes)
        shape_class=shape_class,
    )


def _fake_harness(skip=()) -> Harness:
    return Harness(
        compile=lambda name, variant, config: None if config in skip else config,
        time=lambda fn, sets: fn(*sets[0]),
        copy_us=float,
        rotating=lambda make: [make(), make()],
        as_bytes=list,
        reset=lambda t, byte: t.__setitem__(slice(None), [byte]),
        equal=lambda a, b: a == b,
        progress=lambda line: None,
    )


def test_sweep_ranks_by_the_worst_ratio_and_checks_bytes():
    cases = [_fake_case("small", "bfloat16/k8192"), _fake_case("large", "bfloat16/k8192")]
    results = sweep(cases, {"fake": list(_US["small"])}, _fake_harness())
    assert [(r.case, r.config.threads, r.ratio) for r in results][:2] == [
        ("small", 128, 4.0),
        ("small", 256, 4 / 1.2),
    ]
    assert [r.same for r in results if r.config.threads == 512] == [False, False]
    assert winners(results) == {"fake": {"bfloat16/k8192": _Config(256, 2)}}
    row = results[0].row()
    assert list(row) == ["case", "kernel", "threads", "unroll", "us", "ratio", "same"]


def test_configs_that_do_not_build_are_skipped():
    results = sweep(
        [_fake_case("small", "")], {"fake": list(_US["small"])}, _fake_harness(skip=(_Config(128, 1),))
    )
    assert {r.config for r in results} == {_Config(256, 2), _Config(512, 4)}


def test_write_winners_merges_into_the_table(tmp_path, monkeypatch):
    table = tmp_path / "tuned.json"
    table.write_text(json.dumps({"other": {"sm_90a": {"GPU": {"c": {"x": 1}}}}}))
    best = {"fake": {"bfloat16/k8192": _Config(256, 2), "": _Config(128, 1)}}
    write_winners(table, "sm_90a", "NVIDIA H200", best)
    written = json.loads(table.read_text())
    assert written["other"] == {"sm_90a": {"GPU": {"c": {"x": 1}}}}  # other entries kept
    assert written["fake"] == {"sm_90a": {"NVIDIA H200": {"bfloat16/k8192": {"threads": 256, "unroll": 2}}}}
    # the format cute_kernels.configs reads
    from cute_kernels import configs

    monkeypatch.setattr(configs, "TUNED_TABLE", table)
    configs._tuned.cache_clear()
    try:
        assert configs.tuned_entry("fake", "sm_90a", "NVIDIA H200", "bfloat16/k8192") == {
            "threads": 256,
            "unroll": 2,
        }
    finally:
        configs._tuned.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["pad", "quantize_fp8_col", "swiglu"])
def test_a_short_sweep_on_the_gpu(kernel, tmp_path):
    """The driver end to end on the GPU: a quick sweep with few timing samples, every config's bytes
    the same, the results written."""
    argv = [kernel, "--quick", "--iters", "2", "--warmup", "1", "--reps", "1", "--copy-tries", "1"]
    assert tune.main([*argv, "--out", str(tmp_path)]) == 0
    assert (tmp_path / f"tune_{kernel}.json").exists()
