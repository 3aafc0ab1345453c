"""The `dcgm` source (collectors/dcgm_exporter.py) on real dcgm-exporter output
(tests/fixtures/dcgm_exporter, cited in its README), served by a real local HTTP server so that
the urllib path runs, and on hostile answers: garbage, huge, NaN, negative, sentinel and
out-of-range values, missing and conflicting labels, an endpoint that is down, slow or too big."""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import schemas
from fleetwatch.cli import build_parser
from fleetwatch.collectors import dcgm_exporter
from fleetwatch.collectors.agent import source_options
from fleetwatch.collectors.dcgm_exporter import DcgmExporterSource, host_matches, parse
from fleetwatch.collectors.sources import SOURCE_NAMES, SourceBusy, SourceUnavailable, make_source
from tests.fakes import telemetry_message

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_exporter"
L40S_UUID = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"
L40S_LABELS = (
    f'gpu="0",UUID="{L40S_UUID}",pci_bus_id="00000000:00:07.0",device="nvidia0",'
    'modelName="NVIDIA L40S",Hostname="gpu1-wl8sg",DCGM_FI_DRIVER_VERSION="595.58.03"'
)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


@dataclass
class Answer:
    body: bytes = b""
    status: int = 200
    delay_s: float = 0.0  # before the headers
    drip_s: float = 0.0  # between the body's bytes (a slow-drip server)


class Exporter:
    """A real HTTP server on 127.0.0.1 answering GET /metrics with `answer`."""

    def __init__(self) -> None:
        self.answer = Answer()
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                a = outer.answer
                time.sleep(a.delay_s)
                try:
                    self.send_response(a.status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(a.body)))
                    self.end_headers()
                    if a.drip_s:
                        for i in range(len(a.body)):
                            self.wfile.write(a.body[i : i + 1])
                            self.wfile.flush()
                            time.sleep(a.drip_s)
                    else:
                        self.wfile.write(a.body)
                except OSError:  # the client gave up (a test of its deadline)
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def serve(self, text: str, **kw: Any) -> None:
        self.answer = Answer(body=text.encode("utf-8"), **kw)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    yield e
    e.close()


def source(exporter: Exporter, node: str = "gpu1-wl8sg", **kw: Any) -> DcgmExporterSource:
    return DcgmExporterSource(exporter.url, node=node, **kw)


def valid(part: dict[str, Any]) -> dict[str, Any]:
    """The part merged into a full telemetry/1 message passes the one validator."""
    schemas.validate(telemetry_message(part))
    return part


L40S_GPU = {
    "index": 0,
    "uuid": L40S_UUID,
    "util": 0,
    "mem_util": 0,
    "mem_used_mib": 0.0,
    "temp_c": 32,
    "power_w": 35.686,
    "sm_clock_mhz": 210,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "remapped_rows_failure": 0,
    "pcie_replay": 0,
}


# ---------------------------------------------------------------- real scrapes


def test_a_real_scrape_maps_to_the_nvml_shape(exporter: Exporter) -> None:
    exporter.serve(fixture("upcloud_l40s.prom"))
    out = valid(source(exporter).sample())
    assert out == {"gpus": [L40S_GPU]}
    assert exporter.requests == 1
    # only fields of the contract's GPU object, with the NVML source's names
    assert set(out["gpus"][0]) <= set(schemas.GPU_FIELDS) | {"index"}


def test_both_spellings_of_the_host_label(exporter: Exporter) -> None:
    # the exporter's May 2026 rename (NVIDIA/dcgm-exporter d5e5f51): Hostname= became hostname=
    renamed = fixture("upcloud_l40s.prom").replace(',Hostname="', ',hostname="')
    assert "Hostname" not in renamed
    exporter.serve(renamed)
    assert valid(source(exporter).sample()) == {"gpus": [L40S_GPU]}


def test_the_renamed_label_on_a_real_mig_node(exporter: Exporter) -> None:
    exporter.serve(fixture("pr736_mig_hostname_lower.prom"))
    out = valid(source(exporter, node="dcgm-exporter-wwwjh").sample())
    assert out == {
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-9a63752e-af8d-fe52-7f0d-968bca6d52e3",
                "mem_used_mib": 3744.0,
                "temp_c": 50,
            },
            {"index": 1, "uuid": "GPU-fc60126e-514d-3522-2828-c5daa8e99d85", "temp_c": 44},
            {"index": 2, "uuid": "GPU-63bc0b91-2265-1b94-831c-15c41fe92675", "temp_c": 45},
        ]
    }


def test_another_hosts_series_are_left_out_unless_the_site_says_so(exporter: Exporter) -> None:
    exporter.serve(fixture("upcloud_l40s.prom"))
    assert valid(source(exporter, node="gpu2-other").sample()) == {"gpus": []}
    assert valid(source(exporter, node="gpu2-other", any_host=True).sample()) == {"gpus": [L40S_GPU]}


def test_an_fqdn_label_is_this_short_named_node(exporter: Exporter) -> None:
    exporter.serve(fixture("gardener_t4_fqdn.prom"))
    want = {"gpus": [{"index": 0, "uuid": "GPU-960adb66-4b24-7335-74f2-f334f2220a84", "sm_clock_mhz": 300}]}
    for node in ("ip-10-180-14-93", "IP-10-180-14-93", "ip-10-180-14-93.eu-central-1.compute.internal"):
        assert valid(source(exporter, node=node).sample()) == want
    assert source(exporter, node="ip-10-180-14-9").sample() == {"gpus": []}


def test_host_matching() -> None:
    assert host_matches("node-7", "node-7")
    assert host_matches("Node-7.cluster.local", "node-7")
    assert host_matches("node-7", "node-7.cluster.local")
    assert not host_matches("node-70", "node-7")
    assert not host_matches("", "node-7")
    assert not host_matches("node-7x.cluster", "node-7")


def test_no_host_label_needs_the_sites_word(exporter: Exporter) -> None:
    # the exporter's own README example: no host label, `...` lines the parser refuses, and
    # DCGM's DCGM_INT64_NOT_SUPPORTED sentinel printed as a memory temperature
    exporter.serve(fixture("exporter_readme_quickstart.prom"))
    assert source(exporter).sample() == {"gpus": []}
    out = valid(source(exporter, any_host=True).sample())
    assert out == {
        "gpus": [{"index": 0, "uuid": "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52", "sm_clock_mhz": 139}]
    }


def test_several_hosts_behind_one_endpoint(exporter: Exporter) -> None:
    # three hosts' lines on gpu="0" (a test file assembled from several captures)
    exporter.serve(fixture("datadog_t4_three_hosts.prom"))
    first = {
        "index": 0,
        "uuid": "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",
        "util": 0,
        "mem_util": 0,
        "mem_used_mib": 0.0,
        "temp_c": 25,
        "power_w": 8.969,
        "sm_clock_mhz": 300,
        "pcie_replay": 0,
    }
    src = source(exporter, node="424773df46e0")
    assert valid(src.sample()) == {"gpus": [first]}  # the XID gauge's first scrape: the baseline
    assert valid(src.sample()) == {"gpus": [{**first, "xids": []}]}
    other = valid(source(exporter, node="551bdf382151").sample())
    assert other == {
        "gpus": [{"index": 0, "uuid": "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5", "throttle_reasons": 1}]
    }
    # taking every host: one index with three UUIDs is nobody's GPU 0
    assert valid(source(exporter, node="x", any_host=True).sample()) == {"gpus": []}


def test_mig_instances_repeating_a_gpu_field_are_one_value(exporter: Exporter) -> None:
    exporter.serve(fixture("issue317_a30_mig.prom"))
    src = source(exporter, node="yg-data-k8s-gpu-a30-node-test-test0003")
    want = [
        {"index": 0, "uuid": "GPU-265c9814-6156-355b-e589-ff2064894f16"},
        {"index": 1, "uuid": "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49"},
    ]
    assert valid(src.sample()) == {"gpus": want}
    assert valid(src.sample()) == {"gpus": [{**g, "xids": []} for g in want]}
    # one instance of GPU 1 now says 43: the GPU has an XID 43
    text = fixture("issue317_a30_mig.prom")
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    exporter.serve(text.replace(last, last[: -len(" 0")] + " 43"))
    assert valid(src.sample()) == {"gpus": [{**want[0], "xids": []}, {**want[1], "xids": [43]}]}


def test_instances_that_disagree_leave_the_field_out(exporter: Exporter) -> None:
    lines = [
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",GPU_I_ID="1",hostname="n1"} 40',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",GPU_I_ID="2",hostname="n1"} 41',
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",GPU_I_ID="1",hostname="n1",pod="a"} 100.5',
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",GPU_I_ID="2",hostname="n1",pod="b"} 100.5',
        # the GPU-level series wins over the instances'
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",hostname="n1"} 1000',
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",GPU_I_ID="1",hostname="n1"} 10',
    ]
    exporter.serve("\n".join(lines) + "\n")
    out = valid(source(exporter, node="n1").sample())
    assert out == {"gpus": [{"index": 0, "uuid": "GPU-a", "power_w": 100.5, "mem_used_mib": 1000.0}]}


# ---------------------------------------------------------------- XIDs


def test_the_xid_gauge_turns_into_events_when_it_changes(exporter: Exporter) -> None:
    src = source(exporter)
    exporter.serve(fixture("xid_before.prom"))
    first = valid(src.sample())["gpus"][0]
    assert "xids" not in first  # the baseline: an XID from before the agent is not sent
    assert first == L40S_GPU
    assert valid(src.sample())["gpus"][0]["xids"] == []
    exporter.serve(fixture("xid_after.prom"))
    assert valid(src.sample())["gpus"][0]["xids"] == [79]
    # the gauge keeps its last value: a repeat of 79 is invisible
    assert valid(src.sample())["gpus"][0]["xids"] == []
    # a scrape without the gauge changes nothing, and sends no `xids`
    exporter.serve(fixture("upcloud_l40s.prom"))
    assert "xids" not in valid(src.sample())["gpus"][0]
    exporter.serve(fixture("xid_after.prom"))
    assert valid(src.sample())["gpus"][0]["xids"] == []
    # back to 13: a new XID
    exporter.serve(
        fixture("xid_after.prom").replace('err_code="79"', 'err_code="13"').replace("} 79", "} 13")
    )
    assert valid(src.sample())["gpus"][0]["xids"] == [13]


def test_xid_codes_from_the_label_or_the_value(exporter: Exporter) -> None:
    def xid(extra: str, value: str) -> str:
        return f"DCGM_FI_DEV_XID_ERRORS{{{L40S_LABELS}{extra}}} {value}\n"

    src = source(exporter)
    exporter.serve(xid("", "0"))  # exporters before 3.3.6: no err_code label
    assert "xids" not in src.sample()["gpus"][0]
    exporter.serve(xid("", "48"))
    assert src.sample()["gpus"][0]["xids"] == [48]
    # per-code series: a new err_code beside an old one
    exporter.serve(xid(',err_code="48"', "48") + xid(',err_code="94"', "94"))
    assert valid(src.sample())["gpus"][0]["xids"] == [94]
    exporter.serve(xid(',err_code="48"', "48") + xid(',err_code="94"', "94"))
    assert src.sample()["gpus"][0]["xids"] == []
    # unreadable codes are no gauge: nothing sent, the state kept
    for extra, value in (
        (',err_code="x"', "NaN"),
        (',err_code="²"', "NaN"),  # str.isdigit() takes it, int() does not: it raised out of the scrape
        (',err_code="' + "9" * 5000 + '"', "NaN"),  # past int()'s digit limit: the same
        ("", "-3"),
        ("", "1.5"),
        ("", "1e300"),
        ("", "4294967296"),
    ):
        exporter.serve(xid(extra, value))
        assert "xids" not in valid(src.sample())["gpus"][0], (extra, value)
    exporter.serve(xid("", "94"))
    assert src.sample()["gpus"][0]["xids"] == []


# ---------------------------------------------------------------- hostile answers

GOOD = f"DCGM_FI_DEV_GPU_TEMP{{{L40S_LABELS}}} 33\n"


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("NaN", False),
        ("+Inf", False),
        ("-Inf", False),
        ("1e400", False),
        ("-1", False),
        ("-0.5", False),
        ("9223372036854775794", False),  # DCGM_INT64_NOT_SUPPORTED
        ("9223372036854775794.000000", False),  # the same, printed as a double
        ("2147483634", False),  # DCGM_INT32_NOT_SUPPORTED
        ("140737488355328.000000", False),  # DCGM_FP64_BLANK
        ("4294967296", False),  # past u32
        ("1.5", False),  # a counter is a whole number
        ("0", True),
        ("4294967295", True),
    ],
)
def test_a_counter_value_out_of_contract_is_left_out(exporter: Exporter, value: str, kept: bool) -> None:
    exporter.serve(GOOD + f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{L40S_LABELS}}} {value}\n")
    gpu = valid(source(exporter).sample())["gpus"][0]
    assert gpu["temp_c"] == 33
    assert ("pcie_replay" in gpu) is kept


@pytest.mark.parametrize(
    ("metric", "value", "key", "want"),
    [
        ("DCGM_FI_DEV_GPU_UTIL", "101", "util", None),
        ("DCGM_FI_DEV_GPU_UTIL", "37.5", "util", 37.5),
        ("DCGM_FI_DEV_GPU_TEMP", "251", "temp_c", None),
        ("DCGM_FI_DEV_GPU_TEMP", "-61", "temp_c", None),
        ("DCGM_FI_DEV_POWER_USAGE", "-3.2", "power_w", None),
        ("DCGM_FI_DEV_POWER_USAGE", "1e308", "power_w", 1e308),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "2", "remapped_rows_failure", None),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", "1", "remapped_rows_pending", 1),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "18446744073709551615", "ecc_dbe_aggregate", 18446744073709551615),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "18446744073709551616", "ecc_dbe_aggregate", None),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "4", "throttle_reasons", 4),
    ],
)
def test_field_ranges(exporter: Exporter, metric: str, value: str, key: str, want: Any) -> None:
    exporter.serve(f"{metric}{{{L40S_LABELS}}} {value}\n")
    gpu = valid(source(exporter).sample())["gpus"][0]
    assert gpu.get(key) == want


def test_sums_follow_the_nvml_source(exporter: Exporter) -> None:
    def line(metric: str, value: int) -> str:
        return f"# TYPE {metric} counter\n{metric}{{{L40S_LABELS}}} {value}\n"

    exporter.serve(
        line("DCGM_FI_DEV_RETIRED_SBE", 2) + line("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 5)
    )
    gpu = valid(source(exporter).sample())["gpus"][0]
    assert "retired_pages" not in gpu  # one cause alone would under-report
    assert gpu["nvlink_crc_errors"] == 5  # data CRC is absent on some GPUs
    exporter.serve(
        line("DCGM_FI_DEV_RETIRED_SBE", 2)
        + line("DCGM_FI_DEV_RETIRED_DBE", 1)
        + line("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 5)
        + line("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 7)
        + line("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 3)
        + line("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 11)
    )
    gpu = valid(source(exporter).sample())["gpus"][0]
    assert (gpu["retired_pages"], gpu["nvlink_crc_errors"], gpu["nvlink_replay_errors"]) == (3, 12, 3)
    assert gpu["ecc_sbe_volatile"] == 11


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage that is no exposition text at all\n",
        "\x00\x01\x02\xff{{{}}}\n" * 100,
        "<html><body>502 Bad Gateway</body></html>\n",
        '{"gpus": [{"index": 0}]}\n',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"\n',
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" * 1000,
    ],
)
def test_garbage_gives_no_gpus_and_no_error(exporter: Exporter, text: str) -> None:
    exporter.serve(text)
    assert valid(source(exporter, any_host=True).sample()) == {"gpus": []}


def test_lines_of_other_metrics_and_overlong_lines_are_not_parsed() -> None:
    """prometheus_client's parser is quadratic in a line's length: a 1.5 MiB comment line or one
    sample with 40,000 labels timed the source out at every scrape (an adversarial probe's find).
    Only the lines of the metrics read here, none over MAX_LINE, reach it."""
    labels = ",".join(f'l{i}="v"' for i in range(40_000))
    text = (
        "# " + " " * 1_500_000 + "x\n"
        + f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 1\n"
        + "# HELP node_cpu_seconds_total another exporter's\n"
        + "node_cpu_seconds_total{cpu=\"0\"} 5\n"
        + GOOD
    )  # fmt: skip
    assert [(s.name, s.value) for s in parse(text)] == [("DCGM_FI_DEV_GPU_TEMP", 33.0)]


def test_one_bad_line_costs_only_itself(exporter: Exporter) -> None:
    text = fixture("upcloud_l40s.prom")
    broken = text.replace(
        "# HELP DCGM_FI_DEV_GPU_UTIL", 'DCGM_FI_DEV_GPU_UTIL{gpu="0" ~~~ \n# HELP DCGM_FI_DEV_GPU_UTIL'
    )
    exporter.serve(broken)
    assert valid(source(exporter).sample()) == {"gpus": [L40S_GPU]}
    assert len(parse(broken)) == len(parse(text))


@pytest.mark.parametrize(
    "labels",
    [
        'UUID="GPU-a",hostname="n1"',  # no gpu label
        'gpu="",UUID="GPU-a",hostname="n1"',
        'gpu="abc",UUID="GPU-a",hostname="n1"',
        'gpu="-1",UUID="GPU-a",hostname="n1"',
        'gpu="64",UUID="GPU-a",hostname="n1"',
        'gpu="1000000000000",UUID="GPU-a",hostname="n1"',
        'gpu="٣",UUID="GPU-a",hostname="n1"',  # a digit, not an ASCII one
        'gpu="0",UUID="GPU-a",hostname="n1",nvlink="3"',  # a link entity's series
        'gpu="0",UUID="GPU-a",hostname="n1",nvswitch="nvswitch0"',
        'gpu="0",UUID="GPU-a",hostname=""',
    ],
)
def test_series_that_are_no_gpu_of_this_node(exporter: Exporter, labels: str) -> None:
    exporter.serve(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 40\n")
    assert valid(source(exporter, node="n1").sample()) == {"gpus": []}


def test_identity_labels(exporter: Exporter) -> None:
    long_uuid = "GPU-" + "a" * 200
    exporter.serve(
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",hostname="n1"} 40\n'  # no UUID: the GPU without one
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",UUID="{long_uuid}",hostname="n1"}} 41\n'  # too long to be one
        'DCGM_FI_DEV_GPU_TEMP{gpu="2",uuid="GPU-old",hostname="n1"} 42\n'  # --use-old-namespace
        'DCGM_FI_DEV_GPU_TEMP{gpu="3",UUID="GPU-x",hostname="n1"} 43\n'
        'DCGM_FI_DEV_SM_CLOCK{gpu="3",UUID="GPU-y",hostname="n1"} 1000\n'  # two UUIDs: left out
        'DCGM_FI_DEV_GPU_TEMP{gpu="4",UUID="GPU-z",Hostname="n1",hostname="elsewhere"} 44\n'
    )
    out = valid(source(exporter, node="n1").sample())
    assert out == {
        "gpus": [
            {"index": 0, "temp_c": 40},
            {"index": 1, "temp_c": 41},
            {"index": 2, "uuid": "GPU-old", "temp_c": 42},
            {"index": 4, "uuid": "GPU-z", "temp_c": 44},
        ]
    }


def test_many_gpus_and_escaped_labels(exporter: Exporter) -> None:
    lines = [f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",UUID="GPU-\\"{i}\\\\",hostname="n1"}} {i}' for i in range(64)]
    exporter.serve("\n".join(lines) + "\n")
    out = valid(source(exporter, node="n1").sample())
    assert [g["index"] for g in out["gpus"]] == list(range(64))
    assert out["gpus"][5]["uuid"] == 'GPU-"5\\'


# ---------------------------------------------------------------- the endpoint


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


def test_an_endpoint_that_is_down(caplog: pytest.LogCaptureFixture) -> None:
    src = DcgmExporterSource(closed_port_url(), node="n1", timeout_s=1.0)
    t0 = time.monotonic()
    assert src.sample() == {}  # no `gpus`: another source's are not overwritten
    assert src.sample() == {}
    assert time.monotonic() - t0 < 1.0
    assert sum("gives no GPU data" in r.message for r in caplog.records) == 1  # once per outage


def test_http_errors_and_recovery(exporter: Exporter, caplog: pytest.LogCaptureFixture) -> None:
    src = source(exporter)
    exporter.serve("oops", status=500)
    assert src.sample() == {}
    exporter.serve("not found", status=404)
    assert src.sample() == {}
    exporter.serve(fixture("upcloud_l40s.prom"))
    assert valid(src.sample()) == {"gpus": [L40S_GPU]}
    assert any("answers again" in r.message for r in caplog.records)


def test_a_slow_endpoint_ends_at_the_deadline(exporter: Exporter) -> None:
    exporter.serve(fixture("upcloud_l40s.prom"), delay_s=1.5)
    src = source(exporter, timeout_s=0.3)
    t0 = time.monotonic()
    assert src.sample() == {}
    assert time.monotonic() - t0 < 1.0
    # a server that sends its body a byte at a time: the deadline is the whole body's
    exporter.serve(fixture("upcloud_l40s.prom"), drip_s=0.01)
    t0 = time.monotonic()
    assert src.sample() == {}
    assert time.monotonic() - t0 < 1.0


def test_headers_sent_a_byte_at_a_time_end_at_the_deadline() -> None:
    """A socket's timeout bounds each read, not the answer: an endpoint that sent its status line
    and headers a byte every 0.1 s held the scrape (and the agent's thread for the source) for as
    long as it liked, 12 s in an adversarial probe. The deadline is the whole scrape's."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Padding: " + b"x" * 200 + b"\r\n\r\n"
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            for i in range(len(head)):
                if stop.is_set():
                    return
                try:
                    conn.sendall(head[i : i + 1])
                except OSError:  # the client gave up
                    return
                time.sleep(0.1)

    server = threading.Thread(target=trickle, daemon=True)
    server.start()
    src = DcgmExporterSource(
        f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", node="n1", timeout_s=0.5
    )
    try:
        t0 = time.monotonic()
        assert src.sample() == {}
        assert time.monotonic() - t0 < 1.5  # the trickle alone lasts over 20 s
    finally:
        stop.set()
        server.join(5)
        listener.close()


def test_a_body_cut_short_of_its_length_is_no_body() -> None:
    """An exporter restarting mid-answer closes after part of its Content-Length: the last line's
    value cut (a temperature of 55 read as 5) was taken as the page."""
    body = fixture("upcloud_l40s.prom").encode()
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_short() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
            conn.sendall(head.encode() + body[:-2])

    server = threading.Thread(target=answer_short, daemon=True)
    server.start()
    try:
        src = DcgmExporterSource(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", node="gpu1-wl8sg")
        assert src.sample() == {}
    finally:
        server.join(5)
        listener.close()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:99999/metrics", "out of range"),
        ("http://u:pw@127.0.0.1:9400/metrics", "credentials"),
    ],
)
def test_urls_it_cannot_scrape_are_refused_when_the_source_is_made(url: str, why: str) -> None:
    with pytest.raises(SourceUnavailable, match=why):
        DcgmExporterSource(url)


def test_an_ipv6_literal_without_a_port_is_scraped_on_the_schemes_port() -> None:
    src = DcgmExporterSource("http://[::1]/metrics", node="n1")
    assert (src._parts.hostname, src._port) == ("::1", 80)


def test_a_body_over_the_bound(exporter: Exporter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dcgm_exporter, "MAX_BODY_BYTES", 4096)
    exporter.serve(fixture("upcloud_l40s.prom"))
    assert source(exporter).sample() == {}


def test_a_proxy_in_the_environment_is_not_used(exporter: Exporter, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(var, closed_port_url().removesuffix("/metrics"))
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    exporter.serve(fixture("upcloud_l40s.prom"))
    assert source(exporter).sample() == {"gpus": [L40S_GPU]}


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://x/metrics", "127.0.0.1:9400/metrics", "http:///m"]
)
def test_only_http_urls(url: str) -> None:
    with pytest.raises(SourceUnavailable):
        DcgmExporterSource(url)


def test_one_sample_at_a_time_and_close(exporter: Exporter) -> None:
    exporter.serve(fixture("upcloud_l40s.prom"), delay_s=0.5)
    src = source(exporter)
    worker = threading.Thread(target=src.sample)
    worker.start()
    time.sleep(0.2)
    with pytest.raises(SourceBusy):
        src.sample()
    worker.join()
    src.close()
    src.close()
    with pytest.raises(RuntimeError):
        src.sample()


# ---------------------------------------------------------------- wiring


def test_registered_and_built_from_the_command_line(exporter: Exporter) -> None:
    assert "dcgm" in SOURCE_NAMES
    args = build_parser().parse_args(
        [
            "collect",
            "--source",
            "dcgm",
            "--node",
            "gpu1-wl8sg",
            "--dcgm-url",
            exporter.url,
            "--dcgm-timeout",
            "1.5",
        ]
    )
    options = source_options(args)["dcgm"]
    assert options == {"url": exporter.url, "timeout_s": 1.5, "node": "gpu1-wl8sg", "any_host": False}
    src = make_source("dcgm", **options)
    assert src.name == "dcgm"
    exporter.serve(fixture("upcloud_l40s.prom"))
    assert src.sample() == {"gpus": [L40S_GPU]}
    defaults = source_options(build_parser().parse_args(["collect", "--dcgm-any-host"]))["dcgm"]
    assert defaults == {"url": dcgm_exporter.DEFAULT_URL, "timeout_s": 2.0, "node": None, "any_host": True}
    assert DcgmExporterSource(**defaults).node  # this host's short name
    assert isinstance(args, argparse.Namespace)


def test_the_agent_samples_it_as_a_source(exporter: Exporter, tmp_path: Path) -> None:
    from fleetwatch.collectors.agent import SourceRunner
    from tests.helpers.agents import make_agent

    exporter.serve(fixture("xid_before.prom"))
    options = {"url": exporter.url, "timeout_s": 1.0, "node": "gpu1-wl8sg", "any_host": False}
    agent = make_agent(  # a broker address nothing listens on: the samples stay in the spool
        tmp_path, "127.0.0.1:1", [SourceRunner("dcgm", lambda: make_source("dcgm", **options))]
    )
    try:
        assert agent.tick()["gpus"] == [L40S_GPU]
        exporter.serve(fixture("xid_after.prom"))
        second = agent.tick()
        assert second["gpus"] == [{**L40S_GPU, "xids": [79]}]
        assert second["agent"]["source_errors"] == {}
        schemas.validate(second, schemas.TELEMETRY)
        exporter.close()  # the exporter goes away: no GPUs, the agent goes on
        assert agent.tick()["gpus"] == []
    finally:
        agent.close(drain_timeout_s=0)
