"""``torch_bindings.warn.warn_once``: one warning per key and process, pointing at the caller's
caller as ``stacklevel`` says; ``forget`` re-arms a key."""

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
