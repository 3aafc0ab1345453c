"""The HTML reliability report is a page people open: rendered in a real headless browser
(Debian's chromium, driven over the DevTools protocol), every plot loads and the page logs no
error, no failed load, no exception."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import websocket

from fleetwatch.collectors.sim.workload import WorkloadConfig, draw
from fleetwatch.pipeline.reliability import render, report
from fleetwatch.pipeline.reliability.ingest import Ingest
from fleetwatch.pipeline.reliability.stage import Accounting
from fleetwatch.pipeline.reliability.store import Store


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("chromium not found: apt-get install chromium (scripts/install.sh installs it)")


class Page:
    """One tab of a headless chromium, over the DevTools protocol."""

    def __init__(self, ws: websocket.WebSocket) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            assert time.monotonic() < deadline, f"no {method} in {timeout_s} s"
            self.events.append(json.loads(self.ws.recv()))

    def drain(self, quiet_s: float = 1.0) -> None:
        """Collect what the page still says for `quiet_s` of silence."""
        self.ws.settimeout(quiet_s)
        try:
            while True:
                self.events.append(json.loads(self.ws.recv()))
        except websocket.WebSocketTimeoutException:
            pass


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of a week of a 64-node cluster, with every section filled: failures, lemons,
    long jobs, drains and a data-quality line."""
    from benchmarks.accounting_store import CENSUS_KEY, DRAIN_KEY, messages, records

    tmp = tmp_path_factory.mktemp("page")
    w = draw(WorkloadConfig(nodes=64, days=7, r_f=50.0, lemon_fraction=0.05, lemon_multiplier=20.0, seed=3))
    store = Store(tmp / "acc.sqlite")
    acc = Accounting(store, Ingest(store), CENSUS_KEY, DRAIN_KEY, None)
    recs = records(list(messages(w)))
    acc.apply(recs, recs[-1].timestamp_ms / 1000)
    r = report.build(store, w.cfg.start, w.cfg.start + 7 * 86400 + 1)
    assert r["taxonomy"]["runs"] > 1000 and r["lemons"]["lemons"], "the history fills every section"
    return render.write(r, tmp / "out")["html"]


@pytest.fixture
def page(tmp_path: Path) -> Any:
    proc = subprocess.Popen(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        port_file = tmp_path / "profile" / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, (
                "chromium did not open its DevTools port"
            )
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        ws = None
        while ws is None:
            try:
                import urllib.request

                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    targets = [t for t in json.loads(r.read()) if t["type"] == "page"]
                if targets:
                    ws = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=30)
            except OSError:
                pass
            assert ws is not None or time.monotonic() < deadline, "no page target in chromium"
            time.sleep(0.1)
        p = Page(ws)
        for domain in ("Page", "Runtime", "Log", "Network"):
            p.call(f"{domain}.enable")
        yield p
        ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_every_plot_loads_and_the_page_logs_no_error(page: Page, page_file: Path) -> None:
    page.call("Page.navigate", url=page_file.as_uri())
    page.wait_for("Page.loadEventFired")
    page.drain()
    images = page.call(
        "Runtime.evaluate",
        expression="JSON.stringify(Array.from(document.images).map(i => "
        "({id: i.id, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight})))",
        returnByValue=True,
    )["result"]["value"]
    images = json.loads(images)
    assert [i["id"] for i in images] == [f"plot-{name}" for name, _, _ in render.PLOTS]
    for img in images:
        assert img["complete"] and img["width"] > 100 and img["height"] > 100, img
    headings = page.call(
        "Runtime.evaluate",
        expression="Array.from(document.querySelectorAll('h2')).map(h => h.textContent).join('|')",
        returnByValue=True,
    )["result"]["value"]
    assert "Failure rate r_f" in headings and "Lemon nodes" in headings
    page.drain()
    errors = [
        e
        for e in page.events
        if e.get("method") in ("Runtime.exceptionThrown", "Network.loadingFailed")
        or (
            e.get("method") == "Runtime.consoleAPICalled"
            and e["params"]["type"] in ("error", "warning", "assert")
        )
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] in ("error", "warning"))
    ]
    assert errors == [], errors
