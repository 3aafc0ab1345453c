"""The node agent without a broker: sampling with per-source deadlines, the spool while the broker
is down, and the `fleetwatch collect` CLI's argument checks. Delivery through the spool to a real
Kafka broker, including a broker stopped and restarted mid-run: tests/integration/test_agent.py."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas
from fleetwatch.collectors.agent import Agent, SourceRunner
from fleetwatch.collectors.spool import Spool
from fleetwatch.runtime import StopFlag
from tests.helpers.agents import CountingSource, make_agent
from tests.helpers.paths import REPO


class InstantForwarder:
    """A broker that takes everything at once: the agent's wait is all between its ticks."""

    sent_total = refused_total = 0
    broker_up = True

    def pump(self, budget_s: float, until: Any = None) -> None:
        pass

    def drain(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


class HangingSource:
    name = "host"

    def __init__(self) -> None:
        self.release = threading.Event()

    def sample(self) -> dict[str, Any]:
        self.release.wait(30)
        return {"host": {"load1": 1.0}}

    def close(self) -> None:
        self.release.set()


def test_hung_source_is_reported_not_blocking(tmp_path: Path) -> None:
    hang = HangingSource()
    gpu = CountingSource()
    agent = make_agent(
        tmp_path,
        "127.0.0.1:1",
        [SourceRunner("nvml", lambda: gpu), SourceRunner("host", lambda: hang)],
        call_timeout_s=0.2,
    )
    t0 = time.monotonic()
    first = agent.sample()
    second = agent.sample()
    assert time.monotonic() - t0 < 2.0
    assert first["agent"]["source_errors"] == {"host": "timeout"}
    assert second["agent"]["source_errors"]["host"].startswith("hung")
    assert len(first["gpus"]) == 8 and "host" not in first  # what answered is kept, the rest absent
    assert (first["seq"], second["seq"]) == (0, 1)
    schemas.validate(second, schemas.TELEMETRY)
    hang.release.set()
    agent.close(drain_timeout_s=0)


def test_unavailable_source_is_reported_and_retried(tmp_path: Path) -> None:
    attempts = []

    def broken() -> Any:
        attempts.append(1)
        raise RuntimeError("NVML Shared Library Not Found")

    runner = SourceRunner("nvml", broken, reinit_every_s=0.0)
    agent = make_agent(tmp_path, "127.0.0.1:1", [runner])
    m1, m2 = agent.sample(), agent.sample()
    assert "NVML Shared Library Not Found" in m1["agent"]["source_errors"]["nvml"]
    assert m2["gpus"] == [] and len(attempts) == 2
    agent.close(drain_timeout_s=0)


def test_spool_bound_drops_oldest_while_broker_is_down(tmp_path: Path) -> None:
    gpu = CountingSource()
    agent = make_agent(tmp_path, "127.0.0.1:1", [SourceRunner("nvml", lambda: gpu)], max_bytes=20_000)
    for _ in range(200):
        agent.tick()
    assert agent.spool.bytes <= 20_000
    assert agent.spool.dropped_total > 0
    assert len(agent.spool) + agent.spool.dropped_total == 200
    # the survivors are the newest samples, in order
    seqs = [schemas.decode(r.value)["seq"] for r in agent.spool.peek(limit=1000)]
    assert seqs == list(range(200 - len(seqs), 200))
    agent.close(drain_timeout_s=0)


def test_seq_continues_across_restart(tmp_path: Path) -> None:
    gpu = CountingSource()
    a = make_agent(tmp_path, "127.0.0.1:1", [SourceRunner("nvml", lambda: gpu)])
    for _ in range(3):
        a.tick()
    a.close(drain_timeout_s=0)
    b = make_agent(tmp_path, "127.0.0.1:1", [SourceRunner("nvml", lambda: gpu)])
    assert b.tick()["seq"] == 3
    assert len(b.spool) == 4  # nothing was delivered, nothing lost
    b.close(drain_timeout_s=0)


def test_agent_instance_persists_with_its_spool_and_changes_with_a_new_one(tmp_path: Path) -> None:
    """`agent.instance` names the spool whose seq numbers the samples: the same across restarts on
    one spool, a new one for a new spool (a reinstall, a lost disk), whose seq restarts at 0."""
    gpu = CountingSource()
    a = make_agent(tmp_path / "one", "127.0.0.1:1", [SourceRunner("nvml", lambda: gpu)])
    first = [a.tick() for _ in range(2)]
    a.close(drain_timeout_s=0)
    b = make_agent(tmp_path / "one", "127.0.0.1:1", [SourceRunner("nvml", lambda: gpu)])
    after_restart = b.tick()
    b.close(drain_timeout_s=0)
    c = make_agent(tmp_path / "two", "127.0.0.1:1", [SourceRunner("nvml", lambda: gpu)])
    new_spool = c.tick()
    c.close(drain_timeout_s=0)
    instance = first[0]["agent"]["instance"]
    assert len(instance) == 16 and int(instance, 16) >= 0
    assert [m["agent"]["instance"] for m in first] == [instance, instance]
    assert (after_restart["agent"]["instance"], after_restart["seq"]) == (instance, 2)
    assert new_spool["agent"]["instance"] != instance and new_spool["seq"] == 0
    schemas.validate(new_spool, schemas.TELEMETRY)


def test_agent_samples_take_the_detect_workers_fast_path(tmp_path: Path) -> None:
    """What the agent sends from NVML (fake pynvml, real code path: remapped row counts, NVLinks
    up, a lost GPU, an XID) and /proc is all in the contract, so the detect worker's compiled
    scanner takes it whole: a field outside the contract would send every sample of every node to
    the slower decoders (fleetwatch/telemetry_scan.py)."""
    from fleetwatch import telemetry_scan
    from fleetwatch.collectors.host import HostSource
    from fleetwatch.collectors.nvml import NvmlSource
    from tests.fakes import FakeGpu, FakeLink, FakeNvml

    gpu = FakeGpu(util=90, remapped_rows=(5, 2, 1, 0), nvlinks=[FakeLink(crc_flit=1), FakeLink(active=False)])
    fake = FakeNvml([gpu] * 8)
    nvml = NvmlSource(nvml=fake.module)
    agent = make_agent(
        tmp_path, "127.0.0.1:1", [SourceRunner("nvml", lambda: nvml), SourceRunner("host", HostSource)]
    )
    fake.inject_xid(1, 48)
    fake.lose(6)
    raws = [schemas.encode(agent.tick()) for _ in range(2)]  # what it spools and sends
    agent.close(drain_timeout_s=0)
    assert {"remapped_rows_correctable", "nvlink_links_active"} <= schemas.decode(raws[0])["gpus"][0].keys()
    assert telemetry_scan.scan(raws).taken.tolist() == [0, 1]


def test_collect_cli_rejects_bad_arguments() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "collect", "--source", "gpu", "--node", "n1"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert r.returncode == 2
    assert "unknown source 'gpu'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("bad_node", ["bad node", "-x", "a/b"])
def test_collect_cli_rejects_bad_node_name(bad_node: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fleetwatch.cli", "collect", f"--node={bad_node}", "--source", "host"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert r.returncode == 2 and "not valid" in r.stderr


def _without_dac_override() -> None:
    """In the child, before exec: root without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH obeys file
    modes as any user does, so a read-only directory is read-only to it (the tests run as root,
    where chmod alone stops nothing). Dropped from the bounding set, they are gone after exec."""
    import ctypes

    if os.geteuid() != 0:
        return  # modes already apply
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH (linux/capability.h)
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.parametrize(
    "case",
    [
        "read_only_dir",
        "file_as_dir",
        "no_permission_parent",
        "not_sqlite",
        "read_only_file",
        "dir_as_file",
        "seq_at_int64_max",  # a spool this agent did not write: its numbering must not overflow
        "seq_as_text",
    ],
)
def test_collect_cli_unusable_spool_is_one_line_and_status_2(tmp_path: Path, case: str) -> None:
    spool_dir = tmp_path / "spool"
    if case == "read_only_dir":
        spool_dir.mkdir()
        spool_dir.chmod(0o555)
    elif case == "file_as_dir":
        spool_dir.write_text("not a directory")
    elif case == "no_permission_parent":
        tmp_path.joinpath("locked").mkdir(mode=0o555)
        spool_dir = tmp_path / "locked" / "missing" / "spool"
    elif case == "not_sqlite":
        spool_dir.mkdir()
        (spool_dir / "n1.sqlite").write_bytes(b"\x00garbage, not SQLite" * 100)
    elif case == "read_only_file":  # a spool of an earlier run, made read-only
        Spool(spool_dir / "n1.sqlite", max_bytes=1 << 20).close()
        (spool_dir / "n1.sqlite").chmod(0o444)
    elif case in ("seq_at_int64_max", "seq_as_text"):
        Spool(spool_dir / "n1.sqlite", max_bytes=1 << 20).close()
        with sqlite3.connect(spool_dir / "n1.sqlite") as db:
            value = 2**63 - 1 if case == "seq_at_int64_max" else "seven"
            db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('next_seq', ?)", (value,))
    else:
        (spool_dir / "n1.sqlite").mkdir(parents=True)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetwatch.cli",
            "collect",
            "--node",
            "n1",
            "--source",
            "host",
            "--bootstrap",
            "127.0.0.1:1",
            "--count",
            "1",
            "--spool-dir",
            str(spool_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        preexec_fn=_without_dac_override,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetwatch collect: spool"), r.stderr[-2000:]
    assert str(spool_dir) in lines[0]


class PartSource:
    """A stand-in source that returns `part` (copied) at each call, after `delay_s` on the calls
    listed in `slow`."""

    def __init__(self, part: dict[str, Any], slow: tuple[int, ...] = (), delay_s: float = 0.0) -> None:
        self.part, self.slow, self.delay_s, self.calls = part, slow, delay_s, 0

    def sample(self) -> dict[str, Any]:
        self.calls += 1
        if self.calls in self.slow:
            time.sleep(self.delay_s)
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.part.items()}

    def close(self) -> None:
        pass


def test_a_source_whose_part_is_out_of_contract_is_left_out_alone(tmp_path: Path) -> None:
    """NVML's "not available" (0xFFFFFFFF) as one GPU's util: the GPU source's part is out of
    contract. The whole sample used to become an empty skeleton (no host, no kernel log), every
    second it lasted; now only that part is left out, said in source_errors, and the kernel log's
    cursor of a part left out is not stored (a restart reads those records again)."""
    gpus = PartSource({"gpus": [{"index": 0, "util": float(0xFFFFFFFF)}]})
    host = PartSource({"host": {"load1": 1.0}})
    kernel = PartSource(
        {"kernel": {"records": 3, "events": [{"kind": "xid", "code": 79}]}, "_cursor": {"kmsg_seq": 7}}
    )
    agent = make_agent(
        tmp_path,
        "127.0.0.1:1",
        [
            SourceRunner("nvml", lambda: gpus),
            SourceRunner("host", lambda: host),
            SourceRunner("kernel", lambda: kernel),
        ],
    )
    msg = agent.tick()
    schemas.validate(msg, schemas.TELEMETRY)
    assert msg["host"] == {"load1": 1.0} and msg["kernel"]["events"] == [{"kind": "xid", "code": 79}]
    assert msg["gpus"] == [] and msg["agent"]["source_errors"]["nvml"].startswith("invalid: ")
    assert agent.spool.get_meta("kmsg_seq", 0) == 7
    kernel.part = {"kernel": {"records": -1}, "_cursor": {"kmsg_seq": 9}}
    msg = agent.tick()
    assert "kernel" not in msg and msg["host"] == {"load1": 1.0}
    assert agent.spool.get_meta("kmsg_seq", 0) == 7  # the part left out: its cursor too
    agent.close(drain_timeout_s=0)


def test_a_part_too_large_for_a_record_is_left_out_and_the_rest_is_sent(tmp_path: Path) -> None:
    """A sample over librdkafka's message.max.bytes is refused at produce(), and the forwarder
    resent it for ever, every good sample behind it stuck in the spool."""
    text = "\x01" * 512  # 6 bytes each in JSON
    events = [{"kind": "other", "text": text, "data": text, "process": f"p{i}"} for i in range(256)]
    kernel = PartSource({"kernel": {"records": 256, "events": events}})
    host = PartSource({"host": {"load1": 1.0}})
    agent = make_agent(
        tmp_path, "127.0.0.1:1", [SourceRunner("kernel", lambda: kernel), SourceRunner("host", lambda: host)]
    )
    msg = agent.tick()
    assert "kernel" not in msg and msg["host"] == {"load1": 1.0}
    assert msg["agent"]["source_errors"]["kernel"].startswith("too large: ")
    [rec] = agent.spool.peek(0, 1)
    assert len(rec.value) <= 900_000
    agent.close(drain_timeout_s=0)


def test_a_call_that_returns_after_its_deadline_is_the_next_samples(tmp_path: Path) -> None:
    """A slow NVML answer on a failing GPU is when XID 79 comes: the late call had drained the
    event from NVML, and its result was thrown away when the next tick started a new call."""
    gpus = PartSource({"gpus": [{"index": 0, "util": 5.0, "xids": [79]}]}, slow=(1,), delay_s=0.5)
    agent = make_agent(tmp_path, "127.0.0.1:1", [SourceRunner("nvml", lambda: gpus)], call_timeout_s=0.2)
    first = agent.sample()
    assert first["agent"]["source_errors"] == {"nvml": "timeout"} and first["gpus"] == []
    time.sleep(0.5)
    second = agent.sample()
    assert second["gpus"] == [{"index": 0, "util": 5.0, "xids": [79]}] and gpus.calls == 1
    assert second["agent"]["source_errors"] == {}
    third = agent.sample()
    assert gpus.calls == 2 and third["gpus"][0]["util"] == 5.0
    agent.close(drain_timeout_s=0)


def test_a_late_call_is_taken_when_it_returns_dated_then_not_at_the_next_regular_tick(tmp_path: Path) -> None:
    """Its result was taken at the next regular tick, up to an interval after it was read, and dated
    then: a counter's rate over a step up to an interval too long, then one too short. The agent now
    ticks as soon as it returns."""
    returned: list[float] = []

    class Slow:
        name = "nvml"

        def __init__(self) -> None:
            self.calls = 0

        def sample(self) -> dict[str, Any]:
            self.calls += 1
            if self.calls == 1:
                time.sleep(0.6)  # past the 0.2 s deadline, well before the next tick (2 s)
            returned.append(time.time())
            return {"gpus": [{"index": 0, "util": float(self.calls)}]}

        def close(self) -> None:
            pass

    slow = Slow()
    spool = Spool(tmp_path / "spool.sqlite", max_bytes=1 << 20)
    runner = SourceRunner("nvml", lambda: slow)
    agent = Agent("agent-test", [runner], spool, InstantForwarder(), interval_s=2.0, call_timeout_s=0.2)  # type: ignore[arg-type]
    t0 = time.monotonic()
    assert agent.run(StopFlag(install=False), count=2) == 2
    assert time.monotonic() - t0 < 1.5  # the second tick did not wait for its regular time
    first, second = (schemas.decode(r.value) for r in agent.spool.peek(0, 2))
    assert first["agent"]["source_errors"] == {"nvml": "timeout"}
    assert second["gpus"] == [{"index": 0, "util": 1.0}] and slow.calls == 1  # the late call's part
    assert 0 <= second["ts"] - returned[0] < 0.2  # dated when it came
    runner.close()
    spool.close()


def test_an_early_tick_keeps_the_cadence_and_a_late_failure_makes_none(tmp_path: Path) -> None:
    """The early tick for a late result took the place of the next regular one, so every source
    saw a gap of an interval and a half; and a call that failed late made an early tick that
    carried nothing but its error."""

    class Late:
        name = "nvml"

        def __init__(self, fail: bool) -> None:
            self.calls, self.fail = 0, fail

        def sample(self) -> dict[str, Any]:
            self.calls += 1
            if self.calls == 1:
                time.sleep(0.3)  # past the 0.1 s deadline, 0.7 s before the next regular tick
                if self.fail:
                    raise OSError("NVML: GPU is lost")
            return {"gpus": [{"index": 0, "util": float(self.calls)}]}

        def close(self) -> None:
            pass

    for fail, want in ((False, 4), (True, 3)):
        spool = Spool(tmp_path / f"spool-{fail}.sqlite", max_bytes=1 << 20)
        runner = SourceRunner("nvml", lambda fail=fail: Late(fail))
        agent = Agent("agent-test", [runner], spool, InstantForwarder(), interval_s=1.0, call_timeout_s=0.1)  # type: ignore[arg-type]
        t0 = time.time()
        agent.run(StopFlag(install=False), count=want)
        ts = [schemas.decode(r.value)["ts"] - t0 for r in agent.spool.peek(0, want)]
        regular = [t for t in ts if abs(t - round(t)) < 0.15]
        assert [round(t) for t in regular] == [0, 1, 2], (fail, ts)  # every regular tick, on time
        assert len(ts) == want, (fail, ts)  # the early tick only where a result came late
        runner.close()
        spool.close()


def test_a_source_whose_start_hangs_blocks_nothing(tmp_path: Path) -> None:
    """NvmlSource() calls NVML (init, per GPU handles, UUIDs, event registration), which can hang as
    its sample can: it was made in the agent's own thread, and no source was sampled meanwhile."""
    release = threading.Event()
    host = PartSource({"host": {"load1": 1.0}})

    def hanging_nvml() -> Any:
        release.wait(30)
        return PartSource({"gpus": [{"index": 0, "util": 1.0}]})

    agent = make_agent(
        tmp_path,
        "127.0.0.1:1",
        [SourceRunner("nvml", hanging_nvml), SourceRunner("host", lambda: host)],
        call_timeout_s=0.2,
    )
    t0 = time.monotonic()
    first, second = agent.sample(), agent.sample()
    assert time.monotonic() - t0 < 2.0
    assert first["host"] == second["host"] == {"load1": 1.0}
    assert first["agent"]["source_errors"] == {"nvml": "timeout"}
    assert second["agent"]["source_errors"] == {"nvml": "hung: the source's start has not returned"}
    release.set()
    time.sleep(0.2)
    assert agent.sample()["gpus"] == [{"index": 0, "util": 1.0}]
    agent.close(drain_timeout_s=0)


def test_a_late_result_cuts_the_forwarders_pump_short(tmp_path: Path) -> None:
    """With records in flight (a backlog, slow acknowledgements) the agent spent the rest of the
    interval in the forwarder's pump, and a late result waited there: dated most of an interval
    late after all. The pump stops between flushes when the agent has one to take."""
    from fleetwatch.bus import Delivery, Outgoing
    from fleetwatch.collectors.forwarder import SpoolForwarder

    class Unacknowledged:  # a broker that takes its time
        def send(self, topic: str, key: bytes | None = None, value: bytes | None = None) -> Delivery:
            return Delivery(Outgoing(topic, key, value, None, None))

        def flush(self, timeout_s: float) -> list[Any]:
            time.sleep(timeout_s)
            return []

        def close(self, timeout_s: float = 0) -> None:
            pass

    spool = Spool(tmp_path / "s.sqlite", max_bytes=1 << 20)
    spool.append(b"n1", b"a sample")
    fwd = SpoolForwarder(spool, "t", "unused", retry_backoff_s=0.0, producer_factory=Unacknowledged)
    late = threading.Event()
    threading.Timer(0.3, late.set).start()
    t0 = time.monotonic()
    fwd.pump(3.0, until=late.is_set)
    assert 0.25 < time.monotonic() - t0 < 1.0
    spool.close()
