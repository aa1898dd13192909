"""``torch_bindings.warn.warn_once``: one warning per key and process, pointing at the caller's
caller as ``stacklevel`` says, or by default at the first frame outside the library and torch;
``forget`` re-arms a key."""

from __future__ import annotations

import inspect
import warnings

import pytest

from torch_bindings.warn import forget, warn_once

KEY = ("tests.warn", "once")


def _library_function() -> bool:
    return warn_once(KEY, "a slower path", stacklevel=2)  # the warning names this function's caller


def test_warns_once_per_key_and_again_after_forget():
    forget(KEY)
    with pytest.warns(UserWarning, match="a slower path") as record:
        assert _library_function()
    assert record[0].filename == __file__
    assert record[0].lineno == test_warns_once_per_key_and_again_after_forget.__code__.co_firstlineno + 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _library_function()
        assert not warn_once(KEY, "other text, same key")
    forget(KEY)
    with pytest.warns(UserWarning):
        assert _library_function()
    other = ("tests.warn", "another key")
    forget(other)
    with pytest.warns(UserWarning, match="another"):
        assert warn_once(other, "another")  # keys are independent


def test_silent_while_torch_compile_traces():
    """Traced code neither warns nor records the key (no guard on the key set, no graph break);
    the next eager call warns."""
    import torch

    key = ("tests.warn", "compiled")
    forget(key)

    @torch.compile(backend="eager", fullgraph=True)
    def step(x):
        warn_once(key, "from compiled code")
        return x + 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert step(torch.ones(2)).tolist() == [2.0, 2.0]
    with pytest.warns(UserWarning, match="from eager code"):
        assert warn_once(key, "from eager code")


def _emulation_records(record) -> list:
    return [r for r in record if "EMULATION" in str(r.message)]


def test_default_points_at_the_first_frame_outside_the_library_and_torch():
    """Without ``stacklevel`` the warning names the user's line, through any depth of library calls
    and of torch's ``nn.Module`` call machinery: here a module whose forward sits in the library
    (an emulated FP8 expert block on CPU warns from inside ``scaled_grouped_mm``)."""
    import torch

    import torch_bindings as tb
    from torch_bindings.moe import grouped_mm

    module = tb.GroupedExperts(2, 32, 32, recipe="fp8_rowwise")
    x = torch.randn(32, 32).bfloat16()
    ends = torch.tensor([16, 32], dtype=torch.int32)
    forget(grouped_mm.emulation_warning("fp8_rowwise", "cpu"))
    with pytest.warns(UserWarning, match="EMULATION") as record:
        line = inspect.currentframe().f_lineno + 1
        module(x, ends)
    (warned,) = _emulation_records(record)
    assert (warned.filename, warned.lineno) == (__file__, line)


def test_user_stacklevel_skips_library_frames_and_stops_at_the_outermost(monkeypatch):
    from torch_bindings import warn

    def here():
        return warn.user_stacklevel()

    assert here() == 1  # this file is no library: the caller's own frame
    frames = len(inspect.stack(0))  # this test's frame and every one above it
    # every frame counted as the library's: the walk ends at the outermost frame, not past it
    monkeypatch.setattr(warn, "_in_library", lambda filename: True)
    assert here() == frames + 1  # here() is level 1, the outermost frame level frames + 1


def test_pseudo_files_and_relative_names_are_the_users():
    from torch_bindings import warn

    assert not warn._in_library("<string>")
    assert not warn._in_library("relative/torch_bindings/op.py")
    assert warn._in_library(warn.__file__)
    assert not warn._in_library(__file__)
