"""Verdict logic of the report (esreason.report.verdicts): the four outcomes, their boundaries,
the claimed direction, conjunctions, and the findings that use them."""

from __future__ import annotations

import pytest

from esreason.report.verdicts import (AGREES, CONTRADICTED, HOLDS, INCONCLUSIVE, NOT_TESTED, combine,
                                      interval_verdict, point_verdict)


@pytest.mark.parametrize(("value", "low", "high", "expected"), [
    (0.10, 0.02, 0.18, HOLDS),                 # interval above 0
    (0.05, -0.01, 0.11, AGREES),               # point up, interval covers 0
    (-0.02, -0.08, 0.04, INCONCLUSIVE),        # point down, interval covers 0
    (-0.10, -0.18, -0.02, CONTRADICTED),       # interval below 0
    (0.0, -0.05, 0.05, INCONCLUSIVE),          # a zero point estimate agrees with no direction
    (0.04, 0.0, 0.08, AGREES),                 # low exactly 0 does not exclude 0
    (-0.04, -0.08, 0.0, INCONCLUSIVE),         # high exactly 0 does not exclude 0
    (1e-9, 1e-12, 2e-9, HOLDS),                # any strictly positive low holds
    (0.10, None, None, AGREES),                # no interval: at best agrees
    (-0.10, None, None, INCONCLUSIVE),         # no interval: never contradicted
    (0.10, 0.02, None, AGREES),                # half an interval is no interval
    (None, 0.0, 1.0, NOT_TESTED),
])
def test_interval_verdict_outcomes_and_boundaries(value, low, high, expected) -> None:
    assert interval_verdict(value, low, high) == expected


def test_claimed_decrease_mirrors_the_claimed_increase() -> None:
    assert interval_verdict(-0.10, -0.18, -0.02, direction=-1) == HOLDS
    assert interval_verdict(0.10, 0.02, 0.18, direction=-1) == CONTRADICTED
    assert interval_verdict(-0.05, -0.11, 0.01, direction=-1) == AGREES
    assert interval_verdict(0.02, -0.04, 0.08, direction=-1) == INCONCLUSIVE
    assert interval_verdict(-0.04, -0.08, 0.0, direction=-1) == AGREES  # high == 0: not significant
    with pytest.raises(ValueError, match="direction"):
        interval_verdict(0.1, 0.0, 0.2, direction=0)


def test_point_verdict_never_holds() -> None:
    assert point_verdict(True) == AGREES
    assert point_verdict(False) == INCONCLUSIVE
    assert point_verdict(None) == NOT_TESTED


def test_combine_is_the_weakest_part() -> None:
    assert combine([HOLDS, HOLDS]) == HOLDS
    assert combine([HOLDS, AGREES]) == AGREES
    assert combine([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([HOLDS, CONTRADICTED]) == CONTRADICTED
    assert combine([CONTRADICTED, INCONCLUSIVE]) == CONTRADICTED
    assert combine([HOLDS, NOT_TESTED]) == NOT_TESTED
    assert combine([]) == NOT_TESTED


def test_finding_holds_only_for_the_holds_verdict() -> None:
    from esreason.report.findings import Finding

    def f(verdict: str) -> Finding:
        return Finding("x", "claim", "paper", verdict, "evidence")

    assert f(HOLDS).holds is True
    assert f(AGREES).holds is False and f(INCONCLUSIVE).holds is False and f(CONTRADICTED).holds is False
    assert f(NOT_TESTED).holds is None
    assert f(AGREES).as_dict()["verdict"] == AGREES and f(AGREES).as_dict()["holds"] is False
