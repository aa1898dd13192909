"""``torch_bindings.warn.warn_once``: one warning per key and process, pointing at the caller's
caller as ``stacklevel`` says, or by default at the first frame outside the library and torch;
``forget`` re-arms a key."""

from __future__ import annotations

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
        module(x, ends)
    line = test_default_points_at_the_first_frame_outside_the_library_and_torch.__code__.co_firstlineno
    assert (record[0].filename, record[0].lineno) == (__file__, line + 14)


def test_user_stacklevel_counts_from_its_caller():
    from torch_bindings.warn import user_stacklevel

    def here():
        return user_stacklevel()

    assert here() == 1  # this file is no library: the caller's own frame
