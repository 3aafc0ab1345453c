"""The node agent's delivery through the spool to a real Kafka broker, including a broker
stopped and restarted mid-run, and the `fleetwatch collect` CLI end to end (sampling with
per-source deadlines, without a broker, is in tests/unit/test_agent.py)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetwatch import schemas, topics
from fleetwatch.collectors.agent import Agent, SourceRunner
from fleetwatch.collectors.forwarder import SpoolForwarder
from fleetwatch.collectors.spool import Spool
from fleetwatch.runtime import StopFlag
from tests.helpers.agents import CountingSource, make_agent
from tests.helpers.paths import REPO
from tests.integration.services import PrivateBroker, TopicTail


def _seqs_for(tail: TopicTail, node: str, n: int, timeout_s: float) -> list[int]:
    def enough(recs: list[Any]) -> bool:
        return len({schemas.decode(r.value)["seq"] for r in recs if r.key == node.encode()}) >= n

    recs = tail.collect(enough, timeout_s)
    return [m["seq"] for m in tail.messages([r for r in recs if r.key == node.encode()])]


def test_agent_delivers_in_order(kafka_bootstrap: str, topic_tail: Any, tmp_path: Path) -> None:
    tail = topic_tail(topics.TELEMETRY)
    gpu = CountingSource()
    agent = make_agent(
        tmp_path, kafka_bootstrap, [SourceRunner("nvml", lambda: gpu)], node="agent-order", interval_s=0.02
    )
    agent.run(StopFlag(install=False), count=50)
    assert agent.forwarder.drain(30)
    assert len(agent.spool) == 0  # acknowledged records leave the spool
    agent.close()
    seqs = _seqs_for(tail, "agent-order", 50, 30)
    assert seqs == list(range(50))


def test_a_spooled_record_kafka_refuses_for_its_size_is_dropped_not_resent_for_ever(
    kafka_bootstrap: str, topic_tail: Any, tmp_path: Path
) -> None:
    """A record over librdkafka's message.max.bytes (one an earlier release spooled) among good ones,
    through the real client and broker: the forwarder treated its refusal as an outage and sent it
    first again for ever, every good record behind it stuck. Now it is dropped and counted."""
    tail = topic_tail(topics.TELEMETRY)
    spool = Spool(tmp_path / "spool.sqlite", max_bytes=64 << 20)
    node = f"agent-big-{os.getpid()}"
    good = [
        {"schema": "telemetry/1", "node": node, "ts": time.time(), "seq": i, "gpus": []} for i in range(4)
    ]
    spool.append(node.encode(), schemas.encode(good[0]))
    spool.append(node.encode(), b"x" * 1_100_000)
    for m in good[1:]:
        spool.append(node.encode(), schemas.encode(m))
    fwd = SpoolForwarder(spool, topics.TELEMETRY, kafka_bootstrap, retry_backoff_s=0.2)
    assert fwd.drain(30), f"{len(spool)} records still spooled, {fwd.outages} outages"
    assert fwd.refused_total == 1 and fwd.outages == 0
    fwd.close()
    spool.close()
    assert _seqs_for(tail, node, 4, 30) == [0, 1, 2, 3]


def _kafka_clients() -> int:
    """librdkafka clients alive in this process: each has one thread named rdk:main (the threads
    are the library's own, so they are counted from /proc, not threading)."""
    comms = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            comms.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return comms.count("rdk:main")


def test_broker_restart_loses_no_sample(private_broker: PrivateBroker, tmp_path: Path) -> None:
    """Stop the broker mid-run for a few seconds: the agent spools, then replays in order."""
    gpu = CountingSource()
    node = f"agent-outage-{int(time.time())}"
    agent = make_agent(
        tmp_path, private_broker.bootstrap, [SourceRunner("nvml", lambda: gpu)], node=node, interval_s=0.05
    )
    tail = TopicTail(private_broker.bootstrap, topics.TELEMETRY)
    clients_before = _kafka_clients()
    stop = StopFlag(install=False)
    worker = threading.Thread(target=agent.run, args=(stop,))
    worker.start()
    try:
        time.sleep(1.0)
        private_broker.stop()
        time.sleep(3.0)
        spooled_during_outage = len(agent.spool)
        private_broker.start()
        time.sleep(1.0)
    finally:
        stop.set()
        worker.join(30)
    agent.close(drain_timeout_s=60)
    assert spooled_during_outage > 20, "the agent should have spooled while the broker was down"
    # The producer given up in the outage is closed too, its threads gone with it.
    gc.collect()
    assert _kafka_clients() <= clients_before
    total = agent.seq
    recs = tail.collect(
        lambda rs: len({schemas.decode(r.value)["seq"] for r in rs if r.key == node.encode()}) >= total, 60
    )
    seqs = [m["seq"] for m in tail.messages(recs) if m["node"] == node]
    tail.close()
    assert sorted(set(seqs)) == list(range(total)), "every sample arrives"
    # Duplicates are allowed (at-least-once), reordering is not: first arrivals are in seq order.
    first_seen = list(dict.fromkeys(seqs))
    assert first_seen == list(range(total))


def _collect_argv(
    bootstrap: str, node: str, sources: str, interval: float, spool: Path, *extra: str
) -> list[str]:
    """`fleetwatch collect` as a node would run it, with its spool in a test directory."""
    return [sys.executable, "-m", "fleetwatch.cli", "collect", "--bootstrap", bootstrap, "--source", sources,
            "--node", node, "--interval", str(interval), "--spool-dir", str(spool), *extra]  # fmt: skip


def test_collect_cli_end_to_end(kafka_bootstrap: str, topic_tail: Any, tmp_path: Path) -> None:
    """The real `fleetwatch collect` with this machine's host and net sources."""
    tail = topic_tail(topics.TELEMETRY)
    node = "agent-cli"
    r = subprocess.run(
        _collect_argv(kafka_bootstrap, node, "host,net", 0.2, tmp_path, "--count", "5"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    recs = tail.collect(lambda rs: sum(1 for x in rs if x.key == node.encode()) >= 5, 30)
    msgs = [m for m in tail.messages(recs) if m["node"] == node]
    assert [m["seq"] for m in msgs] == list(range(5))
    for m in msgs:
        assert m["host"]["mem_used_frac"] > 0
        assert "eth" in m["net"]
        assert m["agent"]["source_errors"] == {}


def test_nvml_agent_through_kafka(kafka_bootstrap: str, topic_tail: Any, tmp_path: Path) -> None:
    """NvmlSource on the fake pynvml (the same code path as real NVML) through the agent and Kafka:
    an XID event arrives once, on its GPU; a GPU that falls off the bus is still reported."""
    from fleetwatch.collectors.host import HostSource
    from fleetwatch.collectors.nvml import NvmlSource
    from tests.fakes import FakeGpu, FakeNvml

    fake = FakeNvml([FakeGpu(util=95, temp_c=60)] * 8)
    nvml = NvmlSource(nvml=fake.module)
    tail = topic_tail(topics.TELEMETRY)
    node = "agent-nvml"
    agent = make_agent(
        tmp_path,
        kafka_bootstrap,
        [SourceRunner("nvml", lambda: nvml), SourceRunner("host", HostSource)],
        node=node,
        interval_s=0.05,
    )
    agent.tick()
    fake.inject_xid(2, 48)
    agent.tick()
    fake.lose(5)
    agent.tick()
    agent.tick()
    assert agent.forwarder.drain(30)
    agent.close()
    recs = tail.collect(lambda rs: sum(x.key == node.encode() for x in rs) >= 4, 30)
    msgs = [m for m in tail.messages(recs) if m["node"] == node]
    assert [m["seq"] for m in msgs] == [0, 1, 2, 3]
    xids = [[g.get("xids") for g in m["gpus"]] for m in msgs]
    assert xids[1][2] == [48] and xids[2][2] == [] and xids[0][2] == []
    assert 79 in xids[2][5]  # falling off the bus raises XID 79 on that GPU
    lost = next(g for g in msgs[3]["gpus"] if g["index"] == 5)
    assert lost.get("lost") is True and "util" not in lost
    assert all(g["util"] == 95 for g in msgs[3]["gpus"] if g["index"] != 5)
    assert "host" in msgs[0]


def test_collect_stops_cleanly_on_sigterm(kafka_bootstrap: str, topic_tail: Any, tmp_path: Path) -> None:
    """SIGTERM: the agent finishes, delivers what it spooled, and exits 0."""
    import signal

    tail = topic_tail(topics.TELEMETRY)
    node = "agent-sigterm"
    proc = subprocess.Popen(
        _collect_argv(kafka_bootstrap, node, "host", 0.1, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    first = tail.collect(lambda rs: sum(x.key == node.encode() for x in rs) >= 3, 30)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"received SIGTERM" in err
    rest = tail.collect(lambda rs: False, 3)
    seqs = [m["seq"] for m in tail.messages(first + rest) if m["node"] == node]
    assert seqs == list(range(len(seqs))) and len(seqs) >= 3
    spool = Spool(tmp_path / f"{node}.sqlite", max_bytes=1 << 20)
    assert len(spool) == 0  # nothing left behind
    assert spool.get_meta("next_seq") == len(seqs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(port: int, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{labels} ") or line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not served")


def test_collect_keeps_running_on_a_full_disk_during_an_outage(
    private_broker: PrivateBroker, tmp_path: Path
) -> None:
    """The real `fleetwatch collect` (NVML through the fake pynvml, and /proc) with its spool on a
    disk that fills during a broker outage (a file-size limit makes SQLite's writes fail for real,
    as on a full filesystem): it keeps sampling, drops the oldest spooled samples (counted,
    reason="disk_full"), warns once, and delivers the newest in order once the broker is back."""
    node = f"agent-diskfull-{int(time.time())}"
    spool_dir = tmp_path / "spool"
    # The outage started earlier: 100 samples of this node already wait in the spool.
    spool = Spool(spool_dir / f"{node}.sqlite", max_bytes=64 << 20)
    gpu = CountingSource()
    earlier = Agent(
        node,
        [SourceRunner("nvml", lambda: gpu)],
        spool,
        SpoolForwarder(spool, topics.TELEMETRY, "127.0.0.1:1"),
    )
    for _ in range(100):
        earlier.tick()
    earlier.close(drain_timeout_s=0)
    limit = (spool_dir / f"{node}.sqlite").stat().st_size + 32 * 1024  # then the disk is full
    shim = tmp_path / "shim"  # `import pynvml` in the agent gets the fake, 8 GPUs
    shim.mkdir()
    (shim / "pynvml.py").write_text(
        "import sys\nfrom tests.fakes import FakeGpu, FakeNvml\n"
        "sys.modules[__name__] = FakeNvml([FakeGpu(util=90)] * 8).module\n"
    )
    tail = TopicTail(private_broker.bootstrap, topics.TELEMETRY)
    private_broker.stop()
    port = _free_port()

    def full_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    proc = subprocess.Popen(
        _collect_argv(
            private_broker.bootstrap, node, "nvml,host", 0.05, spool_dir, "--metrics-port", str(port)
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)])},
        preexec_fn=full_disk,
    )
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any("refuses writes" in line for line in stderr) and time.monotonic() < deadline:
            assert proc.poll() is None, "".join(stderr)[-3000:]
            time.sleep(0.2)
        assert any("refuses writes" in line for line in stderr), "".join(stderr)[-3000:]
        time.sleep(1.0)  # more samples on the full disk
        assert proc.poll() is None, "".join(stderr)[-3000:]
        assert _metric(port, "fleetwatch_agent_spool_dropped_total", 'reason="disk_full"') > 0
        private_broker.start()
        taken = int(_metric(port, "fleetwatch_agent_samples_total"))  # by the end of the outage
        last = 100 + taken + 20  # and 20 more after it
        recs = tail.collect(
            lambda rs: any(schemas.decode(r.value)["seq"] >= last for r in rs if r.key == node.encode()), 90
        )
        assert proc.poll() is None, "".join(stderr)[-3000:]
    finally:
        proc.terminate()
        rc = proc.wait(60)
        reader.join(10)
        tail.close()
    assert rc == 0, "".join(stderr)[-3000:]
    seqs = list(dict.fromkeys(m["seq"] for m in tail.messages(recs) if m["node"] == node))
    assert seqs and seqs[-1] >= last, "".join(stderr)[-3000:]
    # In order; the oldest spooled samples gave their room to the newest, which all arrive.
    assert seqs == sorted(seqs) and seqs[0] > 0
    assert seqs == list(range(seqs[0], seqs[-1] + 1))
    gpus = next(m for m in tail.messages(recs) if m["seq"] == last)["gpus"]
    assert len(gpus) == 8 and all(g["util"] == 90 for g in gpus)  # NVML, through the fake pynvml
    text = "".join(stderr)
    assert sum("refuses writes" in line for line in stderr) == 1, text[-3000:]  # once, not per sample
    assert "Traceback" not in text


# The agent with no thread and little memory to be had: an address-space limit (RLIMIT_AS, which
# binds root too) with room for no new thread stack. Then the limit is lifted.
_NO_THREADS = """
import json, resource, sys, threading
from pathlib import Path
from fleetwatch.collectors.agent import SourceRunner
from fleetwatch.collectors.host import HostSource
from fleetwatch.runtime import StopFlag
from tests.helpers.agents import make_agent

agent = make_agent(Path(sys.argv[2]), sys.argv[1], [SourceRunner("host", HostSource)], node=sys.argv[3],
                   interval_s=0.05)
threading.stack_size(512 << 20)  # a new Python thread needs 512 MiB of address space
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (8 << 20), resource.RLIM_INFINITY))
agent.run(StopFlag(install=False), count=10)
starved = dict(spooled=len(agent.spool), sent=agent.forwarder.sent_total)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
threading.stack_size(0)
agent.run(StopFlag(install=False), count=10)
delivered = agent.forwarder.drain(30)
agent.close(drain_timeout_s=10)
print(json.dumps(dict(starved=starved, delivered=delivered)))
"""


def test_agent_runs_out_of_threads_and_memory_keeps_sampling_and_delivers_after(
    kafka_bootstrap: str, topic_tail: Any, tmp_path: Path
) -> None:
    """No thread can start (the sources' calls, librdkafka's producer): each sample says so in
    agent.source_errors, the samples are spooled, nothing crashes; once the limit is lifted the
    sources answer again and every sample is delivered, in order."""
    tail = topic_tail(topics.TELEMETRY)
    node = f"agent-starved-{int(time.time())}"
    r = subprocess.run(
        [sys.executable, "-c", _NO_THREADS, kafka_bootstrap, str(tmp_path), node],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    starved = out["starved"]
    assert starved["sent"] == 0 and starved["spooled"] == 10, out
    assert out["delivered"] is True, out
    assert "Traceback" not in r.stderr
    recs = tail.collect(lambda rs: sum(x.key == node.encode() for x in rs) >= 20, 30)
    msgs = list({m["seq"]: m for m in tail.messages(recs) if m["node"] == node}.values())
    assert [m["seq"] for m in msgs] == list(range(20))
    assert all("can't start new thread" in m["agent"]["source_errors"]["host"] for m in msgs[:10])
    assert all("host" in m and m["agent"]["source_errors"] == {} for m in msgs[10:])
