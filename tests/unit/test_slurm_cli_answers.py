"""SlurmClient (alerts/slurm.py) against what Slurm's commands answer, through fakes of them on PATH
(the real Slurm: tests/integration/): a failure is never read as "no reservation", free text in a
reservation's Comment or a node's Reason never passes for a field, and a job's output is bounded.
Findings of an adversarial probe."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fleetwatch.alerts import slurm_drainer
from fleetwatch.alerts.slurm import (
    MAX_OUTPUT_BYTES,
    JobTimeout,
    ReservationRefused,
    ReservationsNotUnderstood,
    SlurmClient,
    SlurmError,
)
from fleetwatch.cli import build_parser

NAME = "fleetwatch-validate-gpu01"


def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **scripts: str) -> None:
    """Fake Slurm commands on PATH: each a Python script (`import sys` given) run with its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("sinfo", "scontrol", "srun", "scancel"):
        exe = bin_dir / name
        exe.write_text(f"#!{sys.executable}\nimport sys\n{scripts.get(name, 'pass')}\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))  # only the fakes: this host may have Slurm's own


def answers(stdout: str = "", stderr: str = "", rc: int = 0) -> str:
    return f"sys.stdout.write({stdout!r}); sys.stderr.write({stderr!r}); sys.exit({rc})"


# ---- a reservation that exists, one that does not, and Slurm not answering ------------------------


def test_only_slurms_not_found_means_no_reservation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools(tmp_path, monkeypatch, scontrol=answers(f"Reservation {NAME} not found\n", rc=1))
    assert SlurmClient().reservation_exists(NAME) is False
    tools(tmp_path, monkeypatch, scontrol=answers(f"ReservationName={NAME} StartTime=now Nodes=gpu01\n"))
    assert SlurmClient().reservation_exists(NAME) is True


def test_slurm_not_answering_about_a_reservation_raises_and_a_delete_is_not_taken_for_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed_out = answers(
        stderr="slurm_load_reservations error: Socket timed out on send/recv operation\n", rc=1
    )
    tools(tmp_path, monkeypatch, scontrol=timed_out)
    with pytest.raises(SlurmError, match="Socket timed out"):
        SlurmClient().reservation_exists(NAME)
    with pytest.raises(SlurmError):
        SlurmClient().delete_reservation(NAME)


@pytest.mark.parametrize(
    ("said", "lasting"),
    [
        ("Error creating the reservation: Invalid user id", True),
        ("Error creating the reservation: Access/permission denied", True),
        ("Error creating the reservation: Invalid node name specified", True),
        ("Error creating the reservation: Socket timed out on send/recv operation", False),
    ],
)
def test_a_reservation_refused_for_good_is_told_from_slurm_being_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: str, lasting: bool
) -> None:
    tools(tmp_path, monkeypatch, scontrol=answers(stderr=said + "\n", rc=1))
    with pytest.raises(ReservationRefused if lasting else SlurmError, match=said.split(": ")[1]):
        SlurmClient().create_reservation(NAME, "gpu01", "root")


# ---- reservations: the Comment is free text ------------------------------------------------------

RESERVATION = (
    "ReservationName=rack3-fw StartTime=2026-01-01T00:00:00 EndTime=2026-01-02T00:00:00 "
    "Duration=1-00:00:00 Nodes=gpu[01-04] NodeCnt=4 CoreCnt=256 Features=(null) PartitionName=(null) "
    "Flags=MAINT,SPEC_NODES TRES=cpu=256 Users=root Groups=(null) Accounts=(null) Licenses=(null) "
    "State=ACTIVE BurstBuffer=(null) MaxStartDelay=(null) Comment="
)


@pytest.mark.parametrize(
    "comment",
    [
        "firmware upgrade, State=pending sign-off",  # hid an active maintenance
        "copied from ReservationName=fleetwatch-validate-old",  # passed for the adapter's own
        "see Nodes=gpu[01-04 in ticket",  # raised, and no node's record was published
    ],
)
def test_a_reservations_comment_never_passes_for_its_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, comment: str
) -> None:
    tools(tmp_path, monkeypatch, scontrol=answers(RESERVATION + comment + "\n"))
    nodes = SlurmClient().maintenance_nodes(except_prefix="fleetwatch-validate-")
    assert nodes == {"gpu01", "gpu02", "gpu03", "gpu04"}


@pytest.mark.parametrize(
    "unreadable",
    [
        "gpu[07-",  # cut short
        "gpu[1-" + "9" * 5000 + "]",  # a bound past int(): ValueError, raised out of the adapter's loop
        "gpu[1-99999999999999999999999]",  # a range past the library's bound
    ],
)
def test_one_unreadable_reservation_still_gives_the_nodes_of_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unreadable: str
) -> None:
    broken = RESERVATION.replace("rack3-fw", "broken").replace("Nodes=gpu[01-04]", "Nodes=" + unreadable)
    tools(tmp_path, monkeypatch, scontrol=answers(broken + "x\n" + RESERVATION + "\n"))
    with pytest.raises(ReservationsNotUnderstood, match="broken") as e:
        SlurmClient().maintenance_nodes()
    assert e.value.nodes == {"gpu01", "gpu02", "gpu03", "gpu04"}


# ---- node Reasons and Comments: free text ----------------------------------------------------------

# what sinfo prints: -O with each field ended by the record separator, or the old -o "%N|%T|%f|%E"
SINFO = """
rows = [("gpu01", "drained", "a100", "RMA: see table\\ngpu02|idle|a100|pasted"),
        ("gpu02", "drained", "a100", "bob: bad PSU")]
if "-O" in sys.argv:
    sys.stdout.write("".join("".join(f + "\\x1e" for f in row) + "\\n" for row in rows))
else:
    sys.stdout.write("".join("|".join(row) + "\\n" for row in rows))
"""


def test_a_reason_with_a_newline_makes_no_node_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools(tmp_path, monkeypatch, sinfo=SINFO)
    states = {info.name: info for info, _features in SlurmClient().node_states()}
    assert set(states) == {"gpu01", "gpu02"}
    assert states["gpu02"].state == "drained" and states["gpu02"].reason == "bob: bad PSU"
    assert states["gpu01"].reason == "RMA: see table\ngpu02|idle|a100|pasted"


def test_one_nodes_reason_is_read_whole_as_every_nodes_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # node() read `-o "%T|%E"` and kept the first line: "RMA: see table" for gpu01 below
    tools(tmp_path, monkeypatch, sinfo=SINFO)
    client = SlurmClient()
    assert client.node("gpu01").reason == "RMA: see table\ngpu02|idle|a100|pasted"
    assert client.node("gpu02") == next(i for i, _f in client.node_states() if i.name == "gpu02")


def test_a_node_without_a_reason_has_an_empty_one_and_one_not_answered_for_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = "".join(f + "\x1e" for f in ("gpu01", "idle", "(null)", "none")) + "\n"
    tools(tmp_path, monkeypatch, sinfo=answers(row * 2))  # one row per partition
    assert SlurmClient().node("gpu01") == SlurmClient().node_states()[0][0]
    assert SlurmClient().node("gpu01").reason == "" and SlurmClient().node("gpu01").state == "idle"
    with pytest.raises(SlurmError, match="gpu09"):
        SlurmClient().node("gpu09")  # sinfo answered, for another node
    for garbage in ("gpu01\x1eidle", "\xff" * 100_000, ""):  # cut short, not rows, nothing
        tools(tmp_path, monkeypatch, sinfo=answers(garbage))
        with pytest.raises(SlurmError, match="gpu01"):
            SlurmClient().node("gpu01")  # an answer read as no node: retried, never a NodeInfo


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_comment_holding_the_separator_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitions: int
) -> None:
    comment = "keep out\x1eticket 9"  # read "keep out", and a drain wrote that back
    tools(tmp_path, monkeypatch, sinfo=f"sys.stdout.write({comment + chr(0x1E) + chr(10)!r} * {partitions})")
    assert SlurmClient().comment("gpu01") == comment


# ---- a validation's job ----------------------------------------------------------------------------


def test_a_jobs_output_is_kept_bounded_and_said_to_be_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 6 MB of 2-byte characters after a document: 4 Mi characters counted as "not too large"
    printed = "sys.stdout.write('{}\\n'); sys.stdout.write('é' * 3_000_000); sys.stderr.write('e' * 10)"
    tools(tmp_path, monkeypatch, srun=printed)
    r = SlurmClient().run_on("gpu01", NAME, ["dcgmi"], timeout_s=60)
    assert r.returncode == 0 and r.truncated
    assert len(r.stdout.encode()) <= MAX_OUTPUT_BYTES + 3 and r.stderr == "e" * 10


def test_a_job_past_its_time_is_cancelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cancelled = tmp_path / "scancel.argv"
    tools(
        tmp_path,
        monkeypatch,
        srun="import time; print('x' * 10, flush=True); time.sleep(30)",
        scancel=f"open({str(cancelled)!r}, 'w').write(' '.join(sys.argv[1:]))",
    )
    with pytest.raises(JobTimeout):
        SlurmClient().run_on("gpu01", NAME, ["dcgmi"], timeout_s=0.5)
    assert cancelled.read_text() == f"--reservation={NAME}"


def test_the_tools_a_validation_needs_are_checked_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools(tmp_path, monkeypatch)
    (tmp_path / "bin" / "srun").unlink()
    SlurmClient()  # validation off: srun not needed
    with pytest.raises(SlurmError, match="srun not found"):
        SlurmClient(tools=("srun", "scancel"))


def test_a_slurm_command_that_cannot_be_run_is_slurm_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools(tmp_path, monkeypatch)
    client = SlurmClient()
    (tmp_path / "bin" / "sinfo").unlink()  # gone since the start (an upgrade): retried, not a crash
    with pytest.raises(SlurmError, match="could not be run"):
        client.node("gpu01")


def test_the_adapter_without_srun_exits_at_start_when_it_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tools(tmp_path, monkeypatch)
    (tmp_path / "bin" / "srun").unlink()
    key = tmp_path / "drain.key"
    key.write_bytes(b"k" * 32)
    monkeypatch.setenv("FLEETWATCH_HOME", str(tmp_path))

    def no_kafka(*_args: object) -> None:
        raise AssertionError("went on to Kafka without srun")

    monkeypatch.setattr(slurm_drainer, "KafkaBus", no_kafka)
    args = build_parser().parse_args(["slurm-drainer", "--drain-key-file", str(key)])
    assert slurm_drainer.run(args) == 3  # at start: every resume would have failed on its own
    assert "srun not found" in capsys.readouterr().err
