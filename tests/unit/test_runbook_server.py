"""act's runbook links (alerts/alert_model.py) and its own server of the pages (fleetwatch/runbooks.py,
fleetwatch/runtime.serve_metrics): every link act builds names a page of docs/runbooks/ that the
server really serves, beside /metrics, over HTTP; nothing else is served from the folder."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from fleetwatch import runbooks, schemas
from fleetwatch.alerts.alert_model import ACT_PAGES, ALERTNAMES, AlertBuilder, runbook_page
from fleetwatch.runtime import serve_metrics
from tests.helpers.findings import finding


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


@pytest.fixture(scope="module")
def served() -> str:
    port = _free_port()
    server = serve_metrics(port, "127.0.0.1", runbooks=runbooks.pages())
    assert server is not None
    yield runbooks.default_base(port, "127.0.0.1")
    server.shutdown()
    server.server_close()


def test_every_link_act_builds_is_a_page_its_server_serves(served: str) -> None:
    builder = AlertBuilder("test", served)
    urls = set()
    for kind in sorted({*ALERTNAMES, *schemas.FINDING_KINDS, "validation", "some_future_kind"}):
        f = {**finding("gpu-node-01", kind="host", rule="r"), "kind": kind}  # any kind a detect may send
        _labels, ann = builder.from_finding(f, None)
        urls.add(ann["runbook_url"])
    urls.add(builder.node_drained("gpu-node-01", "XID 79", ["f1"], False)["annotations"]["runbook_url"])
    urls.add(builder.drain_refused("gpu-node-01", "budget", "1 of 1", ["f1"])["annotations"]["runbook_url"])
    urls.add(builder.storm(("a", "b", "c"), 3, 60.0, 3)["annotations"]["runbook_url"])
    urls.add(builder.drains_paused("drains paused until ...", 0)["annotations"]["runbook_url"])
    assert served + "finding.md" in urls  # the page of a kind this release does not know
    for url in sorted(urls):
        status, kind, body = _get(url)
        assert status == 200, url
        assert kind.startswith("text/plain") and body.startswith(b"# "), url


def test_the_index_lists_every_page_and_metrics_are_still_served(served: str) -> None:
    status, kind, body = _get(served)
    assert status == 200 and kind.startswith("text/html")
    for page in runbooks.pages():
        assert f'href="{page}"'.encode() in body
    status, _kind, body = _get(served.replace("/runbooks/", "/metrics"))
    assert status == 200 and b"# HELP" in body


@pytest.mark.parametrize(
    "path",
    [
        "../README.md",
        "..%2F..%2Fpyproject.toml",
        "xid",
        "xid.md/../../x",
        "%00.md",
        "README.md.bak",
        "x" * 500 + ".md",
    ],
)
def test_nothing_outside_the_folders_own_pages_is_served(served: str, path: str) -> None:
    status, _kind, body = _get(served + path)
    assert status == 404 and body == b"no such runbook page\n"


def test_pages_are_named_as_the_alerts_link_them() -> None:
    book = runbooks.pages()
    assert {runbook_page(k) for k in ALERTNAMES} <= set(book)
    assert set(ACT_PAGES.values()) <= set(book)
    assert runbook_page("validation") in book and runbook_page("not_a_kind") == "finding.md"


def test_the_default_base_names_a_host_on_call_can_reach() -> None:
    assert runbooks.default_base(9110, "10.0.0.5") == "http://10.0.0.5:9110/runbooks/"
    assert runbooks.default_base(9110, "::1") == "http://[::1]:9110/runbooks/"
    assert runbooks.default_base(9110, "0.0.0.0") == f"http://{socket.getfqdn()}:9110/runbooks/"
    assert runbooks.default_base(None, "127.0.0.1") == "/runbooks/"
