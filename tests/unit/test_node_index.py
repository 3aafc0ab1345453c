"""The node stage's one index of nodes (detectors/node_index.py): admission of fresh samples, and
the rows every detector's per-node arrays are indexed by."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch import topics
from fleetwatch.detectors.node_index import NodeIndex
from fleetwatch.detectors.rows import RowIndex
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask

NAMES = st.sampled_from("abcde")
FIXTURES = Path(__file__).parents[1] / "fixtures" / "snapshots"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(NAMES, st.integers(0, 8).map(float)), max_size=8), min_size=1, max_size=8))
def test_admit_keeps_each_nodes_newer_samples_in_order(batches: list[list[tuple[str, float]]]) -> None:
    """On batches with and without a node twice (two code paths): a sample is kept when it is
    newer than every earlier sample of its node, each sample is told its node's latest time
    before the batch, and the index ends with every node's latest time."""
    index = NodeIndex()
    latest: dict[str, float] = {}
    for batch in batches:
        names = [n for n, _t in batch]
        adm = index.admit(names, np.array([t for _n, t in batch], dtype=np.float64))
        want_before = [latest.get(n, np.nan) for n in names]
        want_keep = []
        for node, t in batch:
            new = node not in latest or t > latest[node]
            if new:
                latest[node] = t
            want_keep.append(new)
        assert adm.keep.tolist() == want_keep
        np.testing.assert_array_equal(adm.before, np.array(want_before, dtype=np.float64))
        assert dict(zip(index.names, index.last_ts.tolist(), strict=True)) == latest
        assert index.names == list(dict.fromkeys(n for b in batches for n, _t in b if n in latest))


def test_dropping_nodes_renumbers_the_rest_in_order_and_their_times_follow() -> None:
    index = NodeIndex()
    index.admit([f"n{i}" for i in range(40)], np.arange(40, dtype=np.float64))
    rows = index.drop(["n3", "n0", "unknown", "n39"])
    assert rows is not None
    assert index.names == [f"n{i}" for i in range(40) if i not in (0, 3, 39)]
    assert index.rows == {n: r for r, n in enumerate(index.names)}
    assert index.last_ts.tolist() == [float(n[1:]) for n in index.names]
    # an array indexed by the old rows, rebuilt: each kept node's value in its new row
    before = np.arange(40, dtype=np.float64) * 10
    after = rows.take(before, np.nan)
    assert after[: len(index)].tolist() == [float(n[1:]) * 10 for n in index.names]
    assert index.drop(["unknown"]) is None  # nothing of ours: nothing moves


def test_a_new_node_after_forgetting_gets_a_fresh_row_with_no_time() -> None:
    index = NodeIndex()
    index.admit(["a", "b"], np.array([5.0, 6.0]))
    index.drop(["a"])
    adm = index.admit(["a"], np.array([1.0]))  # older than it was: a new node now, so kept
    assert adm.keep.tolist() == [True] and np.isnan(adm.before[0])
    assert index.names == ["b", "a"] and index.last_ts.tolist() == [6.0, 1.0]


def test_place_puts_a_snapshots_rows_at_this_index_rows() -> None:
    """Snapshots from before the shared index kept each detector's own node order."""
    index = NodeIndex(["a", "b", "c"])
    into = np.full((3, 2), -1.0)
    saved = ["c", "x", "a"]  # another order, a node the index lacks, one it has not
    index.place(saved, np.array([[3.0, 3.0], [9.0, 9.0], [1.0, 1.0]]), into)
    assert into.tolist() == [[1.0, 1.0], [-1.0, -1.0], [3.0, 3.0]]
    same = np.zeros(3)
    index.place(["a", "b", "c"], np.array([1.0, 2.0, 3.0]), same)
    assert same.tolist() == [1.0, 2.0, 3.0]


def test_row_index_registers_new_names_in_the_order_given() -> None:
    ports = RowIndex()
    assert ports.lookup(["mlx5_1/1", "mlx5_0/1", "mlx5_1/1"]).tolist() == [0, 1, 0]
    assert ports.lookup(["mlx5_0/1"]).tolist() == [1]
    assert ports.sources(["mlx5_0/1", "other"]).tolist() == [-1, 0]


def _pre_index_fixture() -> tuple[Any, dict[str, Any]]:
    path = FIXTURES / "make_pre_index.py"
    spec = importlib.util.spec_from_file_location("make_pre_index", path)
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    return maker, json.loads(gzip.decompress((FIXTURES / "pre_index.json.gz").read_bytes()))


def test_a_snapshot_from_before_the_index_restores_and_goes_on_as_that_release_did() -> None:
    """Written by the release before the shared index (tests/fixtures/snapshots/make_pre_index.py):
    each detector had its own node order (the statistical detector's differs from the others'),
    and a node had been forgotten. Restored today, the task produces what that release produced
    after the snapshot, finding for finding."""
    maker, fixture = _pre_index_fixture()
    saved = fixture["snapshot"]
    assert saved["stats"]["nodes"] != saved["hardware"]["nodes"]  # the case this is about
    task = NodeTask.from_bytes(json.dumps(saved).encode(), JobTable(), maker.CONFIG)
    try:
        batches = maker.stream()
        then = [
            [[t, k, m] for t, k, m in task.process(topics.TELEMETRY, [dict(m) for m in b])]
            for b in batches[len(batches) // 2 :]
        ]
        assert json.loads(json.dumps(then)) == fixture["then"]
        assert any(m["kind"] == "statistical" for b in then for t, _k, m in b if t == topics.FINDINGS)
        # and the snapshot it writes now holds one node order, which the previous release reads
        d = orjson.loads(task.to_bytes())
        assert d["hardware"]["nodes"] == d["stats"]["nodes"] == d["lemon"]["nodes"] == list(d["last_ts"])
    finally:
        task.close()
