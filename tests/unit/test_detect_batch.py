"""TelemetryBatch: columnar arrays from telemetry/1 dicts. The message builders (telemetry,
gpu_entry, ib_port) are in tests/helpers/batches.py, shared with the other detector tests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch import schemas
from fleetwatch.detectors.batch import (
    ETH_COL,
    ETH_NUMERIC,
    GPU_COL,
    GPU_NUMERIC,
    HOST_NUMERIC,
    IB_COL,
    IB_NUMERIC,
    TelemetryBatch,
)
from tests.helpers.batches import assert_same_batch, gpu_entry, ib_port, telemetry

# ---------------------------------------------------------------- tests


def test_shapes_and_values() -> None:
    msgs = [telemetry("n1", 100.0), telemetry("n2", 100.5, 4), telemetry("n1", 101.0)]
    b = TelemetryBatch.from_messages(msgs)
    assert b.size == 3
    assert b.node_names == ["n1", "n2"]
    assert b.nodes() == ["n1", "n2", "n1"]
    assert b.gpu.shape == (3, 8, len(GPU_NUMERIC))
    assert b.present.sum(axis=1).tolist() == [8, 4, 8]
    # n2 has 4 GPUs: the other slots are absent, NaN, and not "lost" (never reported at all).
    assert np.isnan(b.gpu[1, 4:]).all()
    assert not b.lost.any()
    assert b.gpu[0, 2, GPU_COL["temp_c"]] == 62.0
    assert b.ts.tolist() == [100.0, 100.5, 101.0]
    assert b.host.shape == (3, len(HOST_NUMERIC))
    assert b.ib.shape == (3, len(IB_NUMERIC))
    assert b.ib_key == ["mlx5_0/1"] * 3
    assert b.ib_active.tolist() == [1.0, 1.0, 1.0]


def test_missing_fields_are_nan_not_invented() -> None:
    gpus = [gpu_entry(0, ecc_sbe_volatile=None, temp_c=None), gpu_entry(1)]
    b = TelemetryBatch.from_messages([telemetry("n1", 1.0, gpus, host={"cpu_util": 5.0})])
    assert math.isnan(b.gpu[0, 0, GPU_COL["ecc_sbe_volatile"]])
    assert math.isnan(b.gpu[0, 0, GPU_COL["temp_c"]])
    assert b.gpu[0, 0, GPU_COL["util"]] == 95.0
    assert b.gpu[0, 1, GPU_COL["temp_c"]] == 62.0
    assert b.host[0].tolist()[0] == 5.0 and np.isnan(b.host[0, 1:]).all()


def test_lost_gpus_and_index_gaps() -> None:
    gpus = [gpu_entry(0), {"index": 3, "uuid": "GPU-3"}, {"index": 5, "lost": True}]
    b = TelemetryBatch.from_messages([telemetry("n1", 1.0, gpus)])
    assert b.gpu.shape[1] == 6
    assert b.present[0].tolist() == [True, False, False, True, False, True]
    assert b.lost[0].tolist() == [False, False, False, True, False, True]


def test_xids_flattened() -> None:
    msgs = [
        telemetry("n1", 1.0, [gpu_entry(0), gpu_entry(2, xids=[79, 48])]),
        telemetry("n2", 1.0, [gpu_entry(1, xids=[13])]),
    ]
    b = TelemetryBatch.from_messages(msgs)
    assert list(zip(b.xid_msg.tolist(), b.xid_gpu.tolist(), b.xid_code.tolist(), strict=True)) == [
        (0, 2, 79),
        (0, 2, 48),
        (1, 1, 13),
    ]


def test_ib_ports() -> None:
    ports = [ib_port("mlx5_0", 1), ib_port("mlx5_1", 1, state="1: DOWN", symbol_errors=7)]
    b = TelemetryBatch.from_messages([telemetry("n1", 1.0, ib=ports), telemetry("n2", 1.0, ib=[])])
    assert b.ib_msg.tolist() == [0, 0]
    assert b.ib_key == ["mlx5_0/1", "mlx5_1/1"]
    assert b.ib_active.tolist() == [1.0, 0.0]
    assert b.ib[1, IB_COL["symbol_errors"]] == 7.0
    assert b.ib_state == ["ACTIVE", "1: DOWN"]


def test_empty_batch() -> None:
    b = TelemetryBatch.from_messages([])
    assert b.size == 0 and b.gpu.shape[0] == 0 and len(b.xid_code) == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.sets(st.sampled_from(GPU_NUMERIC)), min_size=0, max_size=4),
        min_size=1,
        max_size=6,
    )
)
def test_matches_per_field_reference(drops: list[list[set[str]]]) -> None:
    """Whatever fields are missing, the fast path gives what a plain per-field loop would."""
    msgs = []
    for k, per_gpu in enumerate(drops):
        gpus = [gpu_entry(i, **{"temp_c": 50.0 + i + k, **dict.fromkeys(d)}) for i, d in enumerate(per_gpu)]
        msgs.append(telemetry(f"n{k % 2}", float(k), gpus))
    b = TelemetryBatch.from_messages(msgs)
    for k, m in enumerate(msgs):
        for g in m["gpus"]:
            want = [float(g.get(f, math.nan)) for f in GPU_NUMERIC]
            got = b.gpu[k, g["index"]].tolist()
            assert np.array_equal(np.array(got), np.array(want), equal_nan=True)


# ---------------------------------------------------------------- the worker's struct path


def _structs(msgs: list[dict[str, Any]]) -> list[Any]:
    return [schemas.decode(schemas.encode(m), schemas.TELEMETRY, struct=True) for m in msgs]


def test_structs_give_the_same_batch_as_dicts_on_simulated_telemetry() -> None:
    """The worker decodes telemetry to compiled structs; the evaluator hands dicts: same columns.
    Simulated telemetry of a faulty cluster has XIDs, lost GPUs, IB ports down, missing fields."""
    from fleetwatch import topics
    from fleetwatch.collectors.sim import Simulation, load_scenario, packaged_path

    sim = Simulation(load_scenario(str(packaged_path("default.yaml")), {"nodes": 16, "duration_s": 240}))
    msgs = [m for ms in sim.ticks() for t, _k, m in ms if t == topics.TELEMETRY]
    structs = _structs(msgs)
    assert all(type(s) is not dict for s in structs)
    for i in range(0, len(msgs), 500):
        assert_same_batch(
            TelemetryBatch.from_messages(msgs[i : i + 500]),
            TelemetryBatch.from_messages(structs[i : i + 500]),
        )
    assert any(
        len(TelemetryBatch.from_messages(msgs[i : i + 500]).xid_code) for i in range(0, len(msgs), 500)
    )


def test_structs_and_dicts_mixed_and_edge_cases() -> None:
    gpus = [gpu_entry(0, temp_c=None, xids=[79]), {"index": 3, "uuid": "GPU-3"}, {"index": 5, "lost": True}]
    msgs = [
        telemetry("n1", 1.0, gpus, host={"cpu_util": 5.0}),
        telemetry("n2", 1.0, ib=[ib_port("mlx5_1", 1, state="1: DOWN", symbol_errors=7)]),
        telemetry("n3", 1.0, [gpu_entry(0)], ib=[]),
    ]
    del msgs[2]["host"], msgs[2]["net"]
    want = TelemetryBatch.from_messages(msgs)
    structs = _structs(msgs)
    assert_same_batch(want, TelemetryBatch.from_structs(structs))
    # a mix: each form read its own way, then put back in order (IB names compared port by port)
    mixed = TelemetryBatch.from_messages([structs[0], msgs[1], structs[2]])
    assert_same_batch(want, mixed, skip=("ib_key_names", "ib_key_idx", "ib_state_names", "ib_state_idx"))
    assert (mixed.ib_key, mixed.ib_state) == (want.ib_key, want.ib_state)
    assert_same_batch(TelemetryBatch.from_messages([]), TelemetryBatch.from_structs([]))


# ---------------------------------------------------------------- Ethernet ports


def _with_eth(node: str, ts: float, eth: list[dict[str, Any]]) -> dict[str, Any]:
    m = telemetry(node, ts)
    m["net"]["eth"] = eth
    return schemas.validate(m, schemas.TELEMETRY)


def test_ethernet_ports_are_columns_like_ib_ports() -> None:
    """Each interface a row: its message, its name (interned; "" where absent), the numbers in
    ETH_NUMERIC order (NaN absent), its operstate and whether that says up (NaN for "unknown" or
    none: the driver does not say)."""
    eth = [
        {"iface": "eno1", "state": "up", "rx_errors": 3, "carrier_changes": 5},
        {"iface": "docker0", "state": "down"},
        {"iface": "tun0", "state": "unknown", "tx_bytes": 7},
        {"rx_bytes": 1},
        {"iface": "eno1.100", "state": "lowerlayerdown"},
    ]
    msgs = [_with_eth("n1", 1.0, eth), _with_eth("n2", 1.0, []), _with_eth("n1", 2.0, eth[:1])]
    b = TelemetryBatch.from_messages(msgs)
    assert b.eth_msg.tolist() == [0, 0, 0, 0, 0, 2]
    assert b.eth_iface == ["eno1", "docker0", "tun0", "", "eno1.100", "eno1"]
    assert b.eth_state == ["up", "down", "unknown", None, "lowerlayerdown", "up"]
    assert np.array_equal(b.eth_up, [1.0, 0.0, np.nan, np.nan, 0.0, 1.0], equal_nan=True)
    assert b.eth.shape == (6, len(ETH_NUMERIC))
    assert b.eth[0, ETH_COL["rx_errors"]] == 3 and b.eth[0, ETH_COL["carrier_changes"]] == 5
    assert np.isnan(b.eth[1]).all() and b.eth[2, ETH_COL["tx_bytes"]] == 7
    # the same from the decoders' structs (an absent iface is "" there too)
    structs = TelemetryBatch.from_structs(_structs(msgs))
    assert_same_batch(
        b, structs, skip=("eth_iface_names", "eth_iface_idx", "eth_state_names", "eth_state_idx")
    )
    assert (structs.eth_iface, structs.eth_state) == (b.eth_iface, b.eth_state)
    # taken and put together again: each message keeps its interfaces
    sub = b.take(np.array([2, 0]))
    assert sub.eth_msg.tolist() == [0, 1, 1, 1, 1, 1] and sub.eth_iface[:2] == ["eno1", "eno1"]
    whole = TelemetryBatch.concat([b.take(np.array([0])), b.take(np.array([1, 2]))])
    assert whole.eth_msg.tolist() == b.eth_msg.tolist() and whole.eth_iface == b.eth_iface
    assert np.array_equal(whole.eth, b.eth, equal_nan=True) and whole.eth_state == b.eth_state
    # a message without a net section, or without Ethernet, has no interface
    empty = TelemetryBatch.from_messages([telemetry("n3", 1.0)])
    assert empty.eth.shape == (0, len(ETH_NUMERIC)) and empty.eth_iface == []
