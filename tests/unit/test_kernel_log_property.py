"""Whatever a kernel log holds, the parser never raises, and what it reports holds its grammar:
codes within 32 bits, addresses in one spelling, texts bounded, every number one a JSON encoder
takes (hypothesis: lines made of real fragments and arbitrary text). What a line costs:
tests/unit/test_linear_parsers.py."""

from __future__ import annotations

import re

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch.collectors.kernel_log.events import MAX_CODE, MAX_TEXT, EventParser
from tests.helpers.kernel_lines import parse_all

FRAGMENTS = [
    "NVRM: Xid (PCI:0000:9b:00): ",
    "NVRM: Xid (0000:03:00): ",
    "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): ",
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "fallen off the bus and is not responding to commands.",
    "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
    "NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
    "pcieport 0000:00:02.0: AER: Corrected error received: id=",
    "pcieport 0000:00:1b.2: AER: Uncorrectable (Fatal) error message received from 0000:03:04.0",
    "pcieport 0000:03:04.0: PCIe Bus Error: severity=",
    "    [ 5] SDES  (First)",
    "pid=",
    ", name=",
    "GPU recovery action changed from 0x0 (None) to 0x",
    " Fatal   XC0 i0 Link ",
    "Severity 1 Engine instance 60 Sub-engine instance 00",
    "Data {0x10000000, ",
    "[Tue Mar  5 10:11:12 2024] ",
    "[ 1843.308145] ",
    "6,353,558413,-;",
    " SUBSYSTEM=pci",
    "Mar  5 10:11:12 host kernel: ",
    "2024-03-05T10:11:12.5+02:00 host kernel: ",
    "2024-02-30T29:61:12+99:00 host kernel: ",  # a time that is none
    "[Tue Mar  5 25:11:12 2024] ",
    '{"MESSAGE":',
    "\\x0a",
    "99999999999999999999",
    "4294967296",
    "-1",
]
_PCI = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

line = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=40), st.integers(-(2**70), 2**70).map(str)),
    max_size=8,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(line, max_size=30))
def test_any_log_parses_without_raising_and_events_keep_their_grammar(log: list[str]) -> None:
    parser = EventParser()
    events = parse_all(log, parser)
    for e in events:
        assert e.kind in ("xid", "sxid", "fallen_off_bus", "aer")
        assert e.code is None or 0 <= e.code <= MAX_CODE
        assert e.pci is None or _PCI.match(e.pci), e.pci
        assert len(e.text) <= MAX_TEXT
        assert e.to_dict()["kind"] == e.kind
        # as the agent and `fleetwatch xids` write it: a number past 64 bits (pid=999...9,
        # Link 999...9) made orjson raise and ended a whole `xids` run
        assert orjson.loads(orjson.dumps(e.to_dict()))["kind"] == e.kind
    assert len(parser.uuids) <= 4096
