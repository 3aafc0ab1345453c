"""Process plumbing shared by the long-running commands: logging, clean shutdown on SIGTERM and
their Prometheus metrics server."""

from __future__ import annotations

import contextlib
import gc
import logging
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

# Metrics servers bind loopback unless told otherwise: /metrics names every node, job and open
# finding, which is not for whoever can reach the host. Where Prometheus scrapes from another host
# (or container), --metrics-addr 0.0.0.0 or the address of the interface it scrapes.
METRICS_ADDR = "127.0.0.1"


# What a log record's message may not hold, shown escaped instead: control characters (a newline
# that starts a forged line, a terminal's escape sequences; not the tab), line and paragraph
# separators, bidi overrides and zero-widths. The values logged come from anyone: a Slurm Reason, a
# dcgm-exporter label, a message's text.
_LOG_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


class OneLineRecords(logging.Filter):
    """Each record one line: its message, values formatted in, with _LOG_UNSAFE escaped (a value
    holding "\\n2025-06-01 ... INFO ...: done" wrote a line that looked like the process's own).
    A traceback (exc_info) is the formatter's, after the message, and stays as Python writes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not format: logging reports that itself
            return True
        if _LOG_UNSAFE.search(message):
            record.msg, record.args = _LOG_UNSAFE.sub(_escaped, message), None
        return True


def setup_logging(verbose: bool = False) -> None:
    root = logging.getLogger()
    before = set(root.handlers)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # on the handler made here: a process with handlers already (pytest's, which a session's tests
    # share) keeps them as they are
    for handler in set(root.handlers) - before:
        handler.addFilter(OneLineRecords())
    # librdkafka's own lines arrive on the fleetwatch.bus.rdkafka logger (fleetwatch/bus/config.py)
    # and are kept: during an outage it logs each failed connection attempt (backing off up to
    # reconnect.backoff.max.ms), which is louder than kafka-python was but names the cause.


class StopFlag:
    """Set by SIGTERM/SIGINT; loops check it and finish what they hold before exiting."""

    def __init__(self, install: bool = True) -> None:
        self._event = threading.Event()
        if install and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        logging.getLogger(__name__).info("received %s; finishing up", signal.Signals(signum).name)
        self._event.set()

    def set(self) -> None:
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True if asked to stop meanwhile."""
        return self._event.wait(seconds)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a batch of work (and only that).

    A batch of decoded messages is ~10^5 acyclic dicts; the cyclic collector scanning them again
    and again cost ~30-40% of a batch in the worker and the simulator. Refcounting still frees
    them as usual."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], grace_s: float = 20.0) -> None:
    """SIGTERM every child still running (fleetwatch commands stop cleanly on it), then SIGKILL
    what has not exited after grace_s."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def serve_metrics(
    port: int | None, addr: str = METRICS_ADDR, runbooks: dict[str, bytes] | None = None
) -> WSGIServer | None:
    """Serve Prometheus metrics at http://addr:port/metrics from a daemon thread, as every command
    with --metrics-port does; port None or 0: none. A port that is taken or an address this host
    does not have is a bad argument (ValueError: `fleetwatch` exits 2 with the reason).

    `runbooks` (page name -> text, fleetwatch/runbooks.py): also served, under /runbooks/ (act)."""
    if not port:
        return None
    # Imported here: cli.py imports this module for every command, most of which serve nothing.
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    from fleetwatch.runbooks import with_runbooks

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True  # a slow scraper never holds the process at exit

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape on stderr is noise

    app = make_wsgi_app()
    if runbooks is not None:
        app = with_runbooks(app, runbooks)
    try:
        server = make_server(addr, port, app, Server, handler_class=QuietHandler)
    except OSError as e:
        raise ValueError(f"cannot serve metrics on {addr} port {port}: {e.strerror or e}") from e
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    logging.getLogger(__name__).info("metrics on %s port %d", addr, port)
    return server
