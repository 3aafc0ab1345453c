"""Valid but hostile telemetry never crashes the per-node stage (issue 6: no worker crashes).

Anything the schema accepts — GPUs appearing and vanishing, counters that reset or jump,
unknown XIDs, ports flapping, samples out of order or repeated, extreme in-range values — goes
through NodeTask.process, and whatever comes out is a valid finding/1 or nodefeatures/1.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwatch import schemas
from fleetwatch.detectors.batch import TelemetryBatch
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask

counter = st.integers(0, 2**40)
counter32 = st.integers(0, schemas.U32_MAX)  # the NVML fields that are unsigned int
gpu = st.fixed_dictionaries(
    {"index": st.integers(0, schemas.MAX_GPU_INDEX)},
    optional={
        "util": st.floats(0, 100),
        "mem_util": st.floats(0, 100),
        "temp_c": st.floats(-60, 250),
        "power_w": st.floats(0, 1e6),
        "sm_clock_mhz": st.floats(0, 1e5),
        "throttle_reasons": st.integers(0, 2**32),
        "ecc_sbe_volatile": counter,
        "ecc_dbe_volatile": counter,
        "ecc_sbe_aggregate": counter,
        "ecc_dbe_aggregate": counter,
        "retired_pages": counter32,
        "remapped_rows_pending": st.integers(0, 3),
        "remapped_rows_failure": st.integers(0, 1),
        "nvlink_crc_errors": counter,
        "nvlink_replay_errors": counter,
        "pcie_replay": counter32,
        "xids": st.lists(st.integers(0, 200), max_size=5),
        "lost": st.booleans(),
    },
)
ib_port = st.fixed_dictionaries(
    {"device": st.sampled_from(["mlx5_0", "mlx5_1"]), "port": st.integers(1, 2)},
    optional={
        "state": st.sampled_from(["ACTIVE", "DOWN", "INIT", "POLLING"]),
        "rate_gbps": st.floats(0, 800),
        "symbol_errors": st.integers(0, 65535),
        "link_downed": st.integers(0, 255),
        "rcv_errors": st.integers(0, 65535),
        "xmit_discards": st.integers(0, 65535),
        "tx_bytes": counter,
        "rx_bytes": counter,
    },
)


@st.composite
def telemetry(draw: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "schema": "telemetry/1",
        "node": draw(st.sampled_from(["n1", "n2", "n3", "n4", "n5", "n6"])),
        "ts": 1_764_000_000.0 + draw(st.floats(0, 5000)),
        "seq": draw(st.integers(0, 10_000)),
        "gpus": draw(st.lists(gpu, max_size=10, unique_by=lambda g: g["index"])),
    }
    if draw(st.booleans()):
        m["host"] = {"load1": draw(st.floats(0, 1e4)), "procs_d_state": draw(st.integers(0, 10**6))}
    if draw(st.booleans()):
        m["net"] = {"ib": draw(st.lists(ib_port, max_size=3))}
    if draw(st.booleans()):  # agents reinstalled, and older ones that number without an instance
        m["agent"] = {"instance": draw(st.sampled_from(["a1", "b2", "c3"]))}
    return schemas.validate(m, schemas.TELEMETRY)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(st.lists(st.lists(telemetry(), min_size=1, max_size=25), min_size=1, max_size=6))
def test_node_stage_survives_anything_the_schema_accepts(batches: list[list[dict[str, Any]]]) -> None:
    task = NodeTask(JobTable())
    for batch in batches:
        for topic, key, msg in task.process("fleet.telemetry.v1", TelemetryBatch.from_messages(batch)):
            assert topic in ("fleet.findings.v1", "fleet.nodefeatures.v1", "fleet.nodes.v1")
            if msg is None:  # a census tombstone: the node is forgotten
                assert topic == "fleet.nodes.v1"
                continue
            # every output is a valid message of its schema, keyed as the contract says
            schemas.decode(schemas.encode(msg), key=key.encode() if key else None)
    restored = NodeTask.from_bytes(task.to_bytes(), JobTable())  # and its state always snapshots
    restored.process("fleet.telemetry.v1", TelemetryBatch.from_messages(batches[-1]))


step = st.builds(
    lambda job, node, t, dt, wait: {
        "schema": "step/1", "job": job, "node": node, "rank": 0, "step": 1, "step_time_s": dt,
        "wait_time_s": wait, "ts": 1_764_000_000.0 + t,
    },
    st.sampled_from(["j1", "j2"]), st.sampled_from(["n1", "n2", "n3"]), st.floats(0, 3000),
    st.one_of(st.just(0.0), st.floats(0, 1e4)), st.floats(0, 100),
)  # fmt: skip
feature = st.builds(
    lambda job, node, t, clock, util: {
        "schema": "nodefeatures/1", "job": job, "node": node, "ts": 1_764_000_000.0 + t, "seq": 0,
        "sm_clock_mhz": clock, "util": util,
    },
    st.sampled_from(["j1", "j2"]), st.sampled_from(["n1", "n2", "n3"]), st.floats(0, 3000),
    st.one_of(st.just(0.0), st.floats(0, 3000)), st.floats(0, 100),
)  # fmt: skip


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["steps", "features", "end"]), st.lists(st.one_of(step, feature), max_size=40)
        ),
        max_size=8,
    )
)
def test_job_stage_survives_degenerate_steps(events: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Zero step times, zero clocks, jobs that end mid-stream: valid findings, never an exception."""
    from fleetwatch.pipeline.job_stage import JobTask

    task = JobTask()
    for what, msgs in events:
        if what == "end":
            out = task.process(
                "fleet.jobs.v1",
                [
                    {
                        "schema": "job/1",
                        "job": "j1",
                        "nodes": ["n1", "n2"],
                        "state": "finished",
                        "ts": 1_764_003_000.0,
                    }
                ],
            )
        else:
            topic = "fleet.steps.v1" if what == "steps" else "fleet.nodefeatures.v1"
            out = task.process(
                topic, [m for m in msgs if m["schema"] == ("step/1" if what == "steps" else "nodefeatures/1")]
            )
        for _topic, _key, f in out:
            schemas.decode(schemas.encode(f))
    JobTask.from_bytes(task.to_bytes())
