"""The shared best-of timing helper: each case is called its own number of times per round."""

from __future__ import annotations

import time

from npumem._timing import best_of, calls_for


def test_best_of_calls_each_case_its_count_every_round():
    calls = {"a": 0, "b": 0}

    def case(name):
        def fn():
            calls[name] += 1

        return fn

    t = best_of({"a": case("a"), "b": case("b")}, {"a": 3, "b": 7}, rounds=4)
    assert calls == {"a": 12, "b": 28}
    assert set(t) == {"a", "b"} and all(s >= 0 for s in t.values())
    calls.update(a=0, b=0)
    best_of({"a": case("a"), "b": case("b")}, 5, rounds=2)  # one count for all, as before
    assert calls == {"a": 10, "b": 10}


def test_calls_for_scales_to_the_time_asked_within_bounds():
    assert 1 <= calls_for(lambda: time.sleep(0.002), 0.02) <= 10  # a sleep never returns early
    assert calls_for(lambda: time.sleep(0.002), 0.0) == 1
    assert calls_for(lambda: None, 10.0, most=50) == 50
