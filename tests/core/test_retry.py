"""The readiness probes' look-again loop (rdma_cni.retry), on a clock of the test's own."""

from __future__ import annotations

import pytest

from rdma_cni.retry import look_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_first_look_that_is_done_is_the_answer_without_a_sleep() -> None:
    clock = Clock()
    assert look_until(lambda: "ok", lambda seen: seen == "ok", 10, 1, clock, clock.sleep) == "ok"
    assert clock.slept == []


def test_looks_again_each_interval_until_done() -> None:
    clock = Clock()
    answers = iter([1, 2, 3, 4])
    assert look_until(lambda: next(answers), lambda seen: seen == 3, 10, 0.5, clock, clock.sleep) == 3
    assert clock.slept == [0.5, 0.5]


@pytest.mark.parametrize("wait,looks", [(3.5, 4), (3.0, 4), (0.0, 1), (-1.0, 1)])
def test_never_done_the_last_look_inside_the_wait_is_the_answer(wait: float, looks: int) -> None:
    """Looks at 0, 1, 2 and 3 s for a wait of 3.5 s (and of 3 s: a look due at the deadline is taken);
    none after the first when there is no wait."""
    clock = Clock()
    seen: list[float] = []

    def look() -> float:
        seen.append(clock.now - 100.0)
        return seen[-1]

    assert look_until(look, lambda _: False, wait, 1.0, clock, clock.sleep) == looks - 1
    assert seen == [float(i) for i in range(looks)]
