"""The hardware detector's port and interface entities (detectors/port_map.py): sparse, capped per
node, compacted with the nodes, restored from the snapshots' triples. And through the detector:
a node that sends new port names with every sample (a hostile agent, or a container host's veth
pairs reported by an older agent) grows nothing past its cap, and every other node's ports are
judged as before."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import orjson
import pytest

from fleetwatch.detectors.hardware import HardwareConfig, HardwareDetector
from fleetwatch.detectors.port_map import MAX_PER_NODE, PortMap
from fleetwatch.detectors.rows import Compaction
from tests.helpers.admission import restored_index
from tests.helpers.batches import ib_port, telemetry
from tests.helpers.hardware_runs import opened, run

T0 = 1_764_000_000.0
STEP = 10.0


def ents(pm: PortMap, rows: list[int], names: list[str]) -> list[int]:
    """Entity of each (row, name) element, the names given as a batch gives them (distinct + index)."""
    distinct = list(dict.fromkeys(names))
    idx = np.array([distinct.index(n) for n in names], dtype=np.int64)
    return pm.entities(np.array(rows, dtype=np.int64), distinct, idx).tolist()


def test_entities_are_allocated_in_order_of_first_appearance_and_found_again() -> None:
    pm = PortMap("IB port")
    assert ents(pm, [3, 0, 3, 0], ["mlx5_1/1", "mlx5_0/1", "mlx5_1/1", "mlx5_1/1"]) == [0, 1, 0, 2]
    assert pm.names.names == ["mlx5_1/1", "mlx5_0/1"]  # registered in that order too
    assert ents(pm, [0, 0, 3, 7], ["mlx5_1/1", "mlx5_0/1", "mlx5_1/1", "mlx5_0/1"]) == [2, 1, 0, 3]
    assert pm.n == 4 and pm.triples() == [
        [3, "mlx5_1/1", 0],
        [0, "mlx5_0/1", 1],
        [0, "mlx5_1/1", 2],
        [7, "mlx5_0/1", 3],
    ]


def test_a_node_past_its_cap_is_refused_its_new_names_and_keeps_its_old_ones() -> None:
    pm = PortMap("Ethernet interface", cap=3)
    assert ents(pm, [0, 0, 1], ["a", "b", "a"]) == [0, 1, 2]
    # node 0 has 2: one more fits (c), d and e do not, within one batch; node 1's x still fits
    got = ents(pm, [0, 0, 0, 0, 1, 0], ["c", "d", "e", "a", "x", "d"])
    assert got == [3, -1, -1, 0, 4, -1]
    assert pm.refused == 3 and pm.n == 5
    assert "d" not in pm.names.rows and "e" not in pm.names.rows  # refused names are not registered
    assert ents(pm, [0, 1], ["b", "y"]) == [1, 5]


def test_compaction_keeps_the_surviving_nodes_entities_and_drops_names_no_entity_has() -> None:
    pm = PortMap("IB port")
    ents(pm, [0, 1, 2, 1], ["p", "q", "r", "p"])
    nodes = Compaction.dropping(3, np.array([1]))  # node 1 forgotten: rows 0, 2 -> 0, 1
    kept = pm.compact(nodes)
    assert kept.keep.tolist() == [0, 2]  # entities of nodes 0 and 2, in order
    assert pm.triples() == [[0, "p", 0], [1, "r", 1]]
    assert pm.names.names == ["p", "r"]  # q had only node 1's entity
    assert ents(pm, [1, 0, 1], ["r", "p", "q"]) == [1, 0, 2]


def test_snapshot_triples_restore_and_hostile_ones_are_refused() -> None:
    pm = PortMap("IB port")
    ents(pm, [0, 1, 0], ["p", "q", "q"])
    saved = ["n0", "n1"]
    back = PortMap("IB port")
    back.restore(orjson.loads(orjson.dumps(pm.triples())), saved, {"n1": 0, "n0": 1})  # rows moved
    assert back.triples() == [[1, "p", 0], [0, "q", 1], [1, "q", 2]]
    assert ents(back, [1, 0], ["q", "p"]) == [2, 3]
    for bad in (
        [[0, "p", 0], [1, "q", 10**9]],  # an entity no array could hold
        [[0, "p", 0], [1, "q", 0]],  # one entity twice
        [[0, "p", 0], [5, "q", 1]],  # a node row the snapshot does not have
        [[0, "p", 0], [0, "p", 1]],  # one port of one node twice
    ):
        with pytest.raises(ValueError, match="IB port"):
            PortMap("IB port").restore(bad, saved, {"n0": 0, "n1": 1})


def flood(k: int, per: int) -> dict[str, Any]:
    """A sample of the hostile node: `per` IB ports and interfaces never named before."""
    m = telemetry("evil", T0 + k * STEP, 2, seq=k, ib=[ib_port(f"x{k}_{p}", 1) for p in range(per)])
    m["net"]["eth"] = [{"iface": f"e{k}_{p}", "rx_bytes": 1, "tx_bytes": 1} for p in range(per)]
    return m


def test_a_node_naming_new_ports_in_every_sample_grows_nothing_past_its_cap() -> None:
    """The probe's case: one node sends 256 new IB ports and 256 new interfaces in each of 40
    samples (10,240 of each), beside 20 nodes with one port each, one of them with a flapping
    link. The detector holds at most the cap for the hostile node, its memory stops growing once
    the cap is reached, the snapshot stays small, and the genuine fault is found."""
    det = HardwareDetector(HardwareConfig())
    msgs: list[dict[str, Any]] = []
    for k in range(40):
        for i in range(20):
            p = ib_port("mlx5_0", 1)
            p["link_downed"] = k if i == 7 and k >= 20 else 0  # gpu-07's link goes down and up
            msgs.append(telemetry(f"gpu-{i:02d}", T0 + k * STEP, 2, seq=k, ib=[p]))
        msgs.append(flood(k, 256))
    tracemalloc.start()
    got = run(msgs[: 21 * 4], det)
    at_cap = tracemalloc.get_traced_memory()[0]
    got += run(msgs[21 * 4 :], det)
    grew = tracemalloc.get_traced_memory()[0] - at_cap
    tracemalloc.stop()
    assert det.ib_map.n == 20 + MAX_PER_NODE and det.eth_map.n == MAX_PER_NODE
    assert len(det.ib_map.names) == 1 + MAX_PER_NODE and len(det.eth_map.names) == MAX_PER_NODE
    assert det.ib_map.refused == det.eth_map.refused == 39 * 256
    assert grew < 2 << 20, f"{grew} bytes more after the cap"  # 36 more samples of 512 new names
    assert len(det.to_bytes()) < 400_000
    assert ("gpu-07", "ib_link") in {(f["node"], f["kind"]) for f in opened(got)}
    assert not {f["node"] for f in opened(got)} - {"gpu-07", "evil"}
    # a snapshot round trip keeps every entity
    state = orjson.loads(det.to_bytes())
    back = HardwareDetector.from_state(state, HardwareConfig(), restored_index(det.index))
    assert back.ib_map.triples() == det.ib_map.triples() and back.eth_map.triples() == det.eth_map.triples()


def test_the_node_stage_counts_the_refused_ports_in_its_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from fleetwatch import topics
    from fleetwatch.detectors.batch import TelemetryBatch
    from fleetwatch.pipeline.fleet_metrics import FleetStateCollector
    from fleetwatch.pipeline.job_table import JobTable
    from fleetwatch.pipeline.node_stage import NodeTask

    collector = FleetStateCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    task = NodeTask(JobTable(), metrics=collector)
    for k in range(3):
        task.process(topics.TELEMETRY, TelemetryBatch.from_messages([flood(k, 200)]))
    text = generate_latest(registry).decode()
    # 600 names of each kind, 256 kept: 344 refused of each
    assert 'fleetwatch_detect_ports_refused_total{kind="ib"} 344.0' in text
    assert 'fleetwatch_detect_ports_refused_total{kind="eth"} 344.0' in text
    task.close()


def test_a_name_the_batch_lists_twice_is_one_entity() -> None:
    """A batch's name list can hold a name twice (blocks of a batch decoded apart and joined): the
    pairs are one entity, in the snapshot once, and a restore of it loads (a worker's restore once
    refused it as a port named twice)."""
    pm = PortMap("IB port")
    got = pm.entities(np.array([0, 0, 1, 1]), ["mlx5_0/1", "mlx5_0/1"], np.array([0, 1, 0, 1]))
    assert got.tolist() == [0, 0, 1, 1] and pm.names.names == ["mlx5_0/1"]
    got = pm.entities(np.array([0, 2]), ["mlx5_0/1", "x", "x"], np.array([2, 1]))
    assert got.tolist() == [2, 3] and pm.triples()[2:] == [[0, "x", 2], [2, "x", 3]]
    back = PortMap("IB port")
    back.restore(pm.triples(), ["a", "b", "c"], {"a": 0, "b": 1, "c": 2})
    assert back.triples() == pm.triples()


def test_a_joined_batch_through_the_detector_snapshots_and_restores() -> None:
    """Through the detector, on a batch joined from two (TelemetryBatch.concat keeps each part's
    port names), as the worker joins the blocks of one poll."""
    from fleetwatch.detectors.batch import TelemetryBatch
    from tests.helpers.admission import observe

    parts = [
        TelemetryBatch.from_messages(
            [telemetry(f"n{i}", T0 + k, 2, seq=k + 1, ib=[ib_port("mlx5_0", 1), ib_port("mlx5_1", 1)])]
        )
        for k in range(2)
        for i in range(2)
    ]
    det = HardwareDetector(HardwareConfig())
    observe(det, det.index, TelemetryBatch.concat(parts))
    assert det.ib_map.n == 4 and det.ib_map.names.names == ["mlx5_0/1", "mlx5_1/1"]
    state = orjson.loads(det.to_bytes())
    back = HardwareDetector.from_state(state, HardwareConfig(), restored_index(det.index))
    assert back.ib_map.triples() == det.ib_map.triples()


def test_ports_of_a_node_the_restoring_index_lacks_are_dropped_at_restore() -> None:
    """A hardware snapshot naming a node the task's index does not hold (an older layout, or an
    index of its own): that node's ports and their counters go at the restore, so the next
    snapshot restores too (it would have named them with a row no restore takes)."""
    from fleetwatch.detectors.node_index import NodeIndex

    det = HardwareDetector(HardwareConfig())
    msgs = [
        telemetry(n, T0 + k * STEP, 2, seq=k + 1, ib=[ib_port("mlx5_0", 1), ib_port("mlx5_1", 1)])
        for k in range(3)
        for n in ("n0", "n1")
    ]
    run(msgs, det)
    state = orjson.loads(det.to_bytes())
    only_n1 = NodeIndex(["n1"], [T0 + 2 * STEP])
    back = HardwareDetector.from_state(state, HardwareConfig(), only_n1)
    assert back.ib_map.triples() == [[0, "mlx5_0/1", 0], [0, "mlx5_1/1", 1]]
    assert len(back.ib_counters.last_val) >= 2 and back.ib_map.n == 2
    state = orjson.loads(back.to_bytes())
    again = HardwareDetector.from_state(state, HardwareConfig(), restored_index(only_n1))
    assert again.ib_map.triples() == back.ib_map.triples()
