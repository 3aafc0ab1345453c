"""Issue 23, item 7, end to end on the real broker and Alertmanager: a slow Alertmanager (answers
after 10 s, behind a delaying proxy) holds back no drain request, still receives every alert, and
an act stopped while a post is pending keeps the alert for its restart instead of losing it."""

from __future__ import annotations

import select
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.helpers.findings import finding
from tests.integration.act_rig import ActRig, free_port, metric
from tests.integration.services import APART, TopicTail

# a long file: in the third pytest process, whose share of the tier's time it evens out
pytestmark = APART


class SlowProxy:
    """An Alertmanager that answers after `delay_s`: a threaded proxy in front of the real one.
    A post whose client has given up by then never reaches Alertmanager (it timed out: the
    slow Alertmanager never stored it)."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        self.upstream, self.delay_s = upstream, delay_s
        self.lock = threading.Lock()
        self.pending = self.forwarded = self.abandoned = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with proxy.lock:
                    proxy.pending += 1
                try:
                    time.sleep(proxy.delay_s)
                    if proxy.gone(self.connection):
                        with proxy.lock:
                            proxy.abandoned += 1
                        return
                    req = urllib.request.Request(
                        proxy.upstream + self.path,
                        data=body,
                        method="POST",
                        headers={"Content-Type": "application/json"},
                    )
                    with urllib.request.urlopen(req, timeout=10) as r:
                        status, answer = r.status, r.read()
                    with proxy.lock:
                        proxy.forwarded += 1
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                finally:
                    with proxy.lock:
                        proxy.pending -= 1

            def log_message(self, *_a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def gone(conn: socket.socket) -> bool:
        """The client closed its end (its timeout passed) while we were slow."""
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        try:
            return conn.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_slow_alertmanager_holds_back_no_drain_and_still_gets_every_alert(
    rig: ActRig, topic_tail: Callable[[str], TopicTail]
) -> None:
    proxy = SlowProxy(rig.am.url, delay_s=10.0)
    drains = topic_tail(rig.drains)
    node = f"slow-am-{rig.group}"
    rig.census(node)
    port = free_port()
    argv = ["--fleet-size", "10", "--budget-min-nodes", "1", "--metrics-port", str(port)]
    act = rig.act(*argv, "--alertmanager", proxy.url, "--resend-interval", "60")
    try:
        rig.wait_for_log(0, "assigned")
        sent = time.monotonic()
        rig.send(finding(node, ts=time.time() - 1))
        got = drains.collect(lambda rs: len(rs) >= 1, timeout_s=30)
        took = time.monotonic() - sent
        assert [r.key for r in got] == [node.encode()], rig.logs()
        assert took < 5.0, f"the drain request took {took:.1f} s: it waited for Alertmanager"
        # The alert is on its way, not there yet: the drain did not wait for it.
        assert rig.am.alerts(cluster=rig.cluster) == []
        deadline = time.monotonic() + 5
        while proxy.pending == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.pending >= 1, "no alert post in flight"
        # A slow Alertmanager is not a failed one: every alert arrives.
        alerts = rig.am.wait_for(
            lambda a: {x["labels"]["alertname"] for x in a} >= {"FleetwatchXid", "FleetwatchNodeDrained"},
            timeout_s=40,
            cluster=rig.cluster,
        )
        assert {x["labels"]["alertname"] for x in alerts} >= {"FleetwatchXid", "FleetwatchNodeDrained"}, (
            rig.logs()
        )
        assert proxy.abandoned == 0 and metric(port, "fleetwatch_act_alerts_sent_total") >= 2

        # Stopped while a post is pending: the alert is kept (closing snapshot), counted in the
        # log, and the restarted act delivers it.
        warn = finding(node, "thermal", "warning", "thermal_throttle", ts=time.time(), gpu=3)
        rig.send(warn)
        deadline = time.monotonic() + 10
        while proxy.pending == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.pending >= 1, rig.logs()
        stopped = time.monotonic()
        act.send_signal(signal.SIGTERM)
        assert act.wait(30) == 0
        assert time.monotonic() - stopped < 8.0, "shutdown waited out the slow post past its bound"
        rig.wait_for_log(0, "not delivered to Alertmanager before exit")
        act = rig.act(*argv)  # the real Alertmanager this time
        alerts = rig.am.wait_for(
            lambda a: any(x["labels"]["alertname"] == "FleetwatchThermal" for x in a),
            timeout_s=60,
            cluster=rig.cluster,
        )
        assert any(x["labels"]["alertname"] == "FleetwatchThermal" for x in alerts), rig.logs()
        act.send_signal(signal.SIGTERM)
        assert act.wait(30) == 0
    finally:
        proxy.close()
