"""Telemetry an agent built from a real NVIDIA H200 (tests/fixtures/h200, recorded with
scripts/gpu_check.py) through the detect worker's path: every sample is valid, keyed right, taken
by the compiled scanner (nothing in it outside the contract), and a healthy idle GPU raises no
finding. The fake NVML the other collector tests use must keep producing what this one did."""

from __future__ import annotations

import orjson

from fleetwatch import schemas, telemetry_scan, topics
from fleetwatch.collectors.nvml import NvmlSource
from fleetwatch.pipeline.job_table import JobTable
from fleetwatch.pipeline.node_stage import NodeTask
from fleetwatch.pipeline.telemetry_decode import decode_telemetry
from fleetwatch.record_block import RecordBlock
from tests.fakes import FakeGpu, FakeNvml
from tests.helpers.paths import FIXTURES

H200 = FIXTURES / "h200"


def test_h200_samples_take_the_workers_fast_path_and_raise_nothing() -> None:
    raws = H200.joinpath("telemetry.jsonl").read_bytes().splitlines()
    msgs = [orjson.loads(r) for r in raws]
    assert len(raws) == 8 and all(len(m["gpus"]) == 1 for m in msgs)
    assert telemetry_scan.scan(raws).taken.tolist() == list(range(8))
    node = msgs[0]["node"].encode()
    ref_ms = int((msgs[-1]["ts"] + 1) * 1000)  # arrived a second after the last was taken
    block = RecordBlock.from_values(raws, keys=[node] * 8, append_ms=[ref_ms] * 8)
    batch, bad = decode_telemetry(block, now=0.0, clock=schemas.DEFAULT_CLOCK)
    assert bad == [] and len(batch) == 8
    outputs = NodeTask(JobTable()).process(topics.TELEMETRY, batch)
    assert [t for t, _k, _m in outputs] == [topics.NODES]  # its census entry, and no finding


def test_the_fake_nvml_reports_the_fields_the_real_h200_did() -> None:
    """The same keys from the fake, for a GPU set up like this H200 (no retired-pages call, no
    NVLink in use): tests on the fake see what real NVML gives the collector."""
    real = orjson.loads(H200.joinpath("telemetry.jsonl").read_bytes().splitlines()[0])["gpus"][0]
    fake = FakeNvml([FakeGpu(retired_pages_sbe=None, retired_pages_dbe=None, nvlinks=[])])
    src = NvmlSource(nvml=fake.module)
    got = src.sample()["gpus"][0]
    src.close()
    # read since the H200's sample was taken (issue 25): the PCIe link and NVML's recovery action;
    # the next run on a real GPU records them (collectors/nvml.py reads them where NVML has them)
    since = {
        "pcie_link_gen",
        "pcie_link_gen_max",
        "pcie_link_width",
        "pcie_link_width_max",
        "recovery_action",
    }
    assert set(got) - since == set(real)
