"""Builders of validated telemetry/1 messages for the detector tests (healthy, fully populated
GPU entries and IB ports, overridable field by field), and a column-by-column comparison of two
TelemetryBatches."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetwatch import schemas
from fleetwatch.detectors.batch import TelemetryBatch


def gpu_entry(index: int, **fields: Any) -> dict[str, Any]:
    """A healthy, fully populated GPU entry; keyword arguments override fields, None removes one."""
    g: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{index:08d}",
        "util": 95.0,
        "mem_util": 60.0,
        "mem_used_mib": 60000.0,
        "temp_c": 62.0,
        "power_w": 550.0,
        "sm_clock_mhz": 1980.0,
        "throttle_reasons": 0,
        "ecc_sbe_volatile": 0,
        "ecc_dbe_volatile": 0,
        "ecc_sbe_aggregate": 0,
        "ecc_dbe_aggregate": 0,
        "retired_pages": 0,
        "remapped_rows_pending": 0,
        "remapped_rows_failure": 0,
        "nvlink_crc_errors": 0,
        "nvlink_replay_errors": 0,
        "pcie_replay": 0,
        "xids": [],
    }
    for k, v in fields.items():
        if v is None:
            g.pop(k, None)
        else:
            g[k] = v
    return g


def ib_port(device: str = "mlx5_0", port: int = 1, **fields: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "device": device,
        "port": port,
        "state": "ACTIVE",
        "rate_gbps": 400.0,
        "symbol_errors": 0,
        "link_downed": 0,
        "rcv_errors": 0,
        "xmit_discards": 0,
        "tx_bytes": 0,
        "rx_bytes": 0,
    }
    p.update(fields)
    return p


def telemetry(
    node: str,
    ts: float,
    gpus: int | list[dict[str, Any]] = 8,
    *,
    seq: int | None = None,
    ib: list[dict[str, Any]] | None = None,
    host: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A validated telemetry/1 message; `gpus` is a count of healthy GPUs or explicit entries."""
    m: dict[str, Any] = {
        "schema": schemas.TELEMETRY,
        "node": node,
        "ts": float(ts),
        "seq": int(ts) if seq is None else seq,
        "gpus": [gpu_entry(i) for i in range(gpus)] if isinstance(gpus, int) else gpus,
        "host": host
        if host is not None
        else {
            "cpu_util": 20.0,
            "mem_used_frac": 0.4,
            "load1": 3.0,
            "disk_used_frac": 0.5,
            "procs_d_state": 0,
        },
        "net": {"ib": ib if ib is not None else [ib_port()]},
    }
    return schemas.validate(m, schemas.TELEMETRY)


def assert_same_batch(a: TelemetryBatch, b: TelemetryBatch, skip: tuple[str, ...] = ()) -> None:
    """Every column of two batches equal (NaN equal to NaN), but those named in `skip`."""
    for name in TelemetryBatch.__slots__:
        if name in skip:
            continue
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
        else:  # the sparse sections: msgspec reads a `number` field as a float, json an integer as int
            assert _as_floats(x) == _as_floats(y), name


def _as_floats(v: Any) -> Any:
    """`v` with every integer (not bool) as a float: 2**63 - 1 and 9.223372036854776e18 are one number
    to a detector, though not to `==`."""
    if isinstance(v, dict):
        return {k: _as_floats(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_as_floats(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v
