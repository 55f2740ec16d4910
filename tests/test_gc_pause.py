"""Cyclic collection deferred while episodes are built: off inside, on again after, the block's garbage collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from agentboost.utils.gc_pause import collection_deferred


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_off_inside_on_after_and_the_blocks_cycles_are_collected() -> None:
    assert gc.isenabled()
    with collection_deferred():
        assert not gc.isenabled()
        garbage = _Node()
        alive = weakref.ref(garbage)
        del garbage
        assert alive() is not None
    assert gc.isenabled()
    assert alive() is None


def test_nested_blocks_and_an_error_leave_collection_as_it_was() -> None:
    with pytest.raises(RuntimeError), collection_deferred():
        with collection_deferred():
            pass
        assert not gc.isenabled()  # the inner block's end is not the outer's
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with collection_deferred():
            pass
        assert not gc.isenabled()  # off before: stays off
    finally:
        gc.enable()
