"""Cold start of `fleetwatch detect` (issue 17, item 5): seconds from the process's start to its
first processed telemetry sample, on a fresh install (no compiled code cached) and warm.

A fresh install is simulated with an empty NUMBA_CACHE_DIR: numba then compiles every kernel, as
after `pip install`. The command runs as users run it (`python -m fleetwatch.cli detect`, its own
group, `--start-at latest`) against the local broker, while this script produces one valid
sample to fleet.telemetry.v1 every 0.2 s; the first sample is counted when the process's
fleetwatch_worker_messages_total for that topic is above zero (its metrics endpoint, polled every
0.1 s). Then, while it keeps running, how long until the compiled scanner is loaded (its log line)
and the worker takes the fast path. Warm runs reuse the cache the cold run left.

    python benchmarks/cold_start.py [--warm 2] [--bootstrap 127.0.0.1:19092]

Exits 1 if the cold start's first sample took longer than --target (15 s).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def processed(port: int, group: str) -> float:
    """The detect process's fleetwatch_worker_messages_total for telemetry (0 if not up yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        mine = f'group="{group}"' in line and 'topic="fleet.telemetry.v1"' in line
        if line.startswith("fleetwatch_worker_messages_total{") and mine:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def feed(bootstrap: str, stop: threading.Event) -> None:
    """One valid telemetry/1 sample every 0.2 s, ts = now, until stopped."""
    from fleetwatch import schemas, topics
    from fleetwatch.bus.kafka import KafkaBus

    producer = KafkaBus(bootstrap).producer(linger_ms=5)
    seq = 0
    while not stop.is_set():
        m = {
            "schema": schemas.TELEMETRY,
            "node": "cold-start-node",
            "ts": time.time(),
            "seq": seq,
            "gpus": [],
        }
        producer.send(topics.TELEMETRY, key=b"cold-start-node", value=schemas.encode(m))
        producer.flush(5)
        seq += 1
        stop.wait(0.2)
    producer.close(5)


def start_once(bootstrap: str, cache_dir: str, timeout_s: float) -> dict[str, Any]:
    group = f"cold-start-{uuid.uuid4().hex[:8]}"
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="cold-start-", suffix=".log", delete=False)  # noqa: SIM115
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    env.setdefault("FLEETWATCH_CENSUS_KEY", uuid.uuid4().hex)  # detect signs the census with it
    argv = [sys.executable, "-m", "fleetwatch.cli", "detect", "--bootstrap", bootstrap, "--group", group]
    argv += ["--start-at", "latest", "--metrics-port", str(port)]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    out: dict[str, Any] = {}
    try:
        while processed(port, group) <= 0:
            if proc.poll() is not None:
                raise SystemExit(f"detect exited: {Path(log.name).read_text()[-2000:]}")
            if time.monotonic() - t0 > timeout_s:
                raise SystemExit(f"no sample processed within {timeout_s:.0f} s")
            time.sleep(0.1)
        out["first_sample_s"] = round(time.monotonic() - t0, 2)
        while "telemetry scanner ready" not in Path(log.name).read_text(errors="replace"):
            if time.monotonic() - t0 > timeout_s or proc.poll() is not None:
                out["scanner_ready_s"] = None
                break
            time.sleep(0.2)
        else:
            out["scanner_ready_s"] = round(time.monotonic() - t0, 2)
    finally:
        proc.terminate()
        proc.wait(30)
        Path(log.name).unlink()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("FLEETWATCH_BOOTSTRAP", "127.0.0.1:19092"))
    ap.add_argument("--warm", type=int, default=2, help="warm starts after the cold one")
    ap.add_argument("--target", type=float, default=15.0, help="seconds to the first sample, cold")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()

    from fleetwatch.bus.admin import ensure_topics

    ensure_topics(args.bootstrap)
    stop = threading.Event()
    feeder = threading.Thread(target=feed, args=(args.bootstrap, stop), daemon=True)
    feeder.start()
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
            runs.append({"kind": "cold", **start_once(args.bootstrap, cache, args.timeout)})
            for _ in range(args.warm):
                runs.append({"kind": "warm", **start_once(args.bootstrap, cache, args.timeout)})
    finally:
        stop.set()
        feeder.join(10)
    for r in runs:
        print(json.dumps(r))
    cold = runs[0]["first_sample_s"]
    print(f"cold start to the first sample: {cold:.1f} s (target {args.target:.0f} s)")
    return 0 if cold <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
