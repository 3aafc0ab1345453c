"""Metrics servers listen on loopback unless --metrics-addr says otherwise.

The listening socket's address is read from the kernel's table (/proc/net/tcp, /proc/net/tcp6),
not from what the code meant to bind: a server on 0.0.0.0 answers on 127.0.0.1 too, so a connect
alone cannot tell the two apart.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fleetwatch.cli import build_parser
from fleetwatch.runtime import serve_metrics
from tests.helpers.paths import REPO

METRICS_COMMANDS = ("collect", "simulate", "detect", "act", "slurm-drainer")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _address(hex_ip: str) -> str:
    """An address as /proc/net/tcp{,6} writes it (32-bit words in host byte order) -> text."""
    raw = b"".join(bytes.fromhex(hex_ip[i : i + 8])[::-1] for i in range(0, len(hex_ip), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def listening_on(port: int) -> set[str]:
    """The addresses that TCP sockets in LISTEN state are bound to on this port."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            hex_ip, hex_port = cols[1].split(":")
            if cols[3] == "0A" and int(hex_port, 16) == port:  # 0A: TCP_LISTEN
                found.add(_address(hex_ip))
    return found


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.mark.parametrize("command", METRICS_COMMANDS)
def test_every_metrics_command_defaults_to_loopback(command: str) -> None:
    parser = build_parser()
    assert parser.parse_args([command]).metrics_addr == "127.0.0.1"
    assert parser.parse_args([command, "--metrics-addr", "0.0.0.0"]).metrics_addr == "0.0.0.0"


def test_shared_metrics_server_binds_loopback_only() -> None:
    port = free_port()
    server = serve_metrics(port)
    assert server is not None
    try:
        assert listening_on(port) == {"127.0.0.1"}
        assert "python_info" in scrape(port)  # and it serves
    finally:
        server.shutdown()
        server.server_close()
    assert serve_metrics(0) is None and serve_metrics(None) is None  # no port: no server


def test_a_taken_metrics_port_is_a_bad_argument() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ValueError, match=r"cannot serve metrics on 127\.0\.0\.1 port"):
            serve_metrics(s.getsockname()[1])


def _simulate(*flags: str) -> subprocess.Popen[str]:
    """`fleetwatch simulate` against a bootstrap address where nothing listens: it serves its
    metrics, then waits for the broker (up to a minute) until the test kills it."""
    env = {**os.environ, "FLEETWATCH_CONNECT_TIMEOUT_S": "60"}
    bootstrap = f"127.0.0.1:{free_port()}"
    return subprocess.Popen(
        [sys.executable, "-m", "fleetwatch.cli", "simulate", "--bootstrap", bootstrap, *flags],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_listening(proc: subprocess.Popen[str], port: int) -> set[str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if found := listening_on(port):
            return found
        time.sleep(0.1)
    raise AssertionError(f"no metrics server on port {port}; exit {proc.poll()}")


@pytest.mark.parametrize(("flags", "bound"), [((), "127.0.0.1"), (("--metrics-addr", "0.0.0.0"), "0.0.0.0")])
def test_a_command_binds_the_metrics_address_it_is_given(flags: tuple[str, ...], bound: str) -> None:
    """The real command, its flags passed through to the server."""
    port = free_port()
    proc = _simulate("--metrics-port", str(port), *flags)
    try:
        assert _wait_listening(proc, port) == {bound}
        assert "fleetwatch_sim" in scrape(port)
    finally:
        proc.kill()
        proc.wait(10)


def test_an_address_the_host_does_not_have_exits_2_with_the_reason() -> None:
    proc = _simulate("--metrics-port", str(free_port()), "--metrics-addr", "203.0.113.7")  # TEST-NET-3
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines()[-1].startswith("fleetwatch simulate: cannot serve metrics on 203.0.113.7")
