"""Silent nodes, judged by the other nodes' clocks."""

from __future__ import annotations

from detectors.silence import SilenceDetector

T0 = 1_764_000_000.0


def test_a_silent_node_is_reported_and_resolves() -> None:
    det = SilenceDetector()
    last = {f"n{i}": T0 + 30 for i in range(10)}
    last["n3"] = T0 + 5
    out = det.process(last, set(last) - {"n3"}, T0 + 30)
    assert [(f["node"], f["severity"], f["resolved"]) for f in out] == [("n3", "critical", False)]
    last["n3"] = T0 + 31
    out = det.process(last, {"n3"}, T0 + 31)
    assert [(f["node"], f["resolved"]) for f in out] == [("n3", True)]


def test_one_node_with_a_clock_ahead_does_not_silence_the_rest() -> None:
    det = SilenceDetector()
    last = {f"n{i}": T0 + 30 for i in range(20)}
    last["skewed"] = T0 + 3600  # an hour ahead
    assert det.process(last, set(last), T0 + 3600) == []


def test_a_rack_going_quiet_is_still_seen() -> None:
    det = SilenceDetector()
    last = {f"n{i}": T0 + 60 for i in range(20)}
    for i in range(6):  # 30% of the nodes stop at once
        last[f"n{i}"] = T0 + 20
    out = det.process(last, {f"n{i}" for i in range(6, 20)}, T0 + 60)
    assert {f["node"] for f in out} == {f"n{i}" for i in range(6)}
