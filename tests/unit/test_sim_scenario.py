"""Scenario loading: packaged files, overrides, and clear one-line validation errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch import cli
from fleetwatch.collectors.sim import KINDS, load_scenario, packaged_path, packaged_scenarios
from fleetwatch.collectors.sim.scenario import parse_scenario
from fleetwatch.pipeline.scorecard import ACCEPTED


def write(tmp_path: Path, doc: Any, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc))
    return p


def test_packaged_scenarios_load() -> None:
    names = packaged_scenarios()
    assert {"default.yaml", "healthy.yaml", "scale.yaml"} <= set(names)
    for name in names:
        sc = load_scenario(packaged_path(name))
        assert sc.n_ticks >= 1 and sc.nodes >= 1


def test_default_has_every_kind_and_untouched_nodes() -> None:
    sc = load_scenario(None)
    assert sc.nodes == 32 and sc.duration_s == 300
    assert {f.kind for f in sc.faults} == set(KINDS)
    assert len({f.onset_s for f in sc.faults}) == len(sc.faults)  # each at its own time
    touched = {f.node for f in sc.faults}
    # Truth is unambiguous: faults that share a node (the kernel log's, beside earlier ones) sit on
    # other GPUs, and no finding kind that detects one detects another there without a GPU.
    for node in touched:
        here = [f for f in sc.faults if f.node == node]
        gpus = [f.gpu for f in here if f.gpu is not None]
        assert len(gpus) == len(set(gpus)), here
        node_wide = [k for f in here if f.gpu is None for k in ACCEPTED[f.kind]]
        others = [k for f in here for k in ACCEPTED[f.kind]]
        assert all(others.count(k) == 1 for k in node_wide), here
    assert sc.nodes - len(touched) >= sc.nodes // 4
    assert not sc.background.enabled
    assert not load_scenario(packaged_path("healthy.yaml")).faults
    scale = load_scenario(packaged_path("scale.yaml"))
    assert scale.background.enabled and not scale.faults and scale.nodes >= 1024


def test_overrides_and_lenient_drop(caplog: pytest.LogCaptureFixture) -> None:
    sc = load_scenario(None, {"nodes": 16, "gpus": 4, "seed": 99, "duration": 120.0})
    assert (sc.nodes, sc.gpus_per_node, sc.seed, sc.duration_s) == (16, 4, 99, 120.0)
    full = load_scenario(None)
    kept = [f for f in full.faults if f.node < 16 and f.onset_s < 120 and (f.gpu is None or f.gpu < 4)]
    assert [(f.kind, f.node) for f in sc.faults] == [(f.kind, f.node) for f in kept]
    assert "dropped" in caplog.text
    assert load_scenario(None, {"nodes": None}).nodes == full.nodes  # None = not given


def test_json_and_node_names(tmp_path: Path) -> None:
    doc = {"nodes": 4, "duration_s": 10, "faults": [{"kind": "xid48", "node": "gpu-node-0004", "gpu": 1}]}
    sc = load_scenario(write(tmp_path, doc, "s.json"))
    assert sc.faults[0].node == 3 and sc.faults[0].gpu == 1
    assert sc.faults[0].params == {"duration_s": None}


BASE = {"nodes": 4, "gpus_per_node": 8, "duration_s": 60}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"faults": [{"kind": "xid80", "node": 1}]},
            "faults[0].kind unknown fault kind 'xid80' (known: xid79",
        ),
        (
            {"faults": [{"kind": "xid79", "node": 9}]},
            "faults[0] (xid79).node 9 is out of range: the cluster has 4",
        ),
        ({"faults": [{"kind": "xid79", "node": 0}]}, "faults[0] (xid79).node must be >= 1, got 0"),
        (
            {"faults": [{"kind": "xid79", "node": "gpu-node-0099"}]},
            "'gpu-node-0099' is not a node of this cluster",
        ),
        (
            {"faults": [{"kind": "xid79", "node": 1, "gpu": 8}]},
            "(xid79).gpu 8 is out of range: nodes have 8 GPUs",
        ),
        ({"faults": [{"kind": "xid79"}]}, "faults[0] (xid79) needs a `node`"),
        ({"faults": [{"node": 1}]}, "faults[0] needs a `kind`"),
        ({"faults": [{"kind": "xid79", "node": 1, "ramp_s": 5}]}, "unknown field(s) ['ramp_s']"),
        ({"faults": [{"kind": "node_down", "node": 1, "gpu": 0}]}, "node_down is a node-level fault"),
        ({"faults": [{"kind": "straggler", "node": 1, "slowdown": "x"}]}, "slowdown must be a number"),
        ({"faults": [{"kind": "straggler", "node": 1, "cause": "cosmic"}]}, "cause must be one of"),
        ({"faults": [{"kind": "thermal", "node": 1, "ramp_s": 50, "duration_s": 20}]}, "must exceed ramp_s"),
        ({"faults": [{"kind": "ib_link_down", "node": 1, "port": 8}]}, "port 8 is out of range"),
        ({"faults": [{"kind": "xid48", "node": 1, "onset_s": 60}]}, "is not before the end of the run"),
        ({"faults": [{"kind": "xid48", "node": 1, "onset_s": -1}]}, "onset_s must be >= 0.0"),
        ({"faults": {"kind": "xid48"}}, "faults must be a list"),
        ({"nodes": 0}, "nodes must be >= 1"),
        ({"nodes": 2.5}, "nodes must be an integer"),
        ({"interval_s": 0}, "interval_s must be >= 0.01"),
        ({"duration_s": 0.5, "interval_s": 1}, "shorter than one interval"),
        ({"colour": "red"}, "top level has unknown field(s) ['colour']"),
        ({"jobs": {"sizes": []}}, "jobs.sizes must be a non-empty list"),
        ({"jobs": {"step_time_s": [3, 1]}}, "jobs.step_time_s low 3.0 is above high 1.0"),
        ({"background": {"acceleration": -1}}, "background.acceleration must be >= 0.0"),
        ({"background": {"enabled": "yes"}}, "background.enabled must be true or false"),
        ({"node_prefix": "-bad"}, "node_prefix must be a plain name prefix"),
    ],
)
def test_validation_errors_are_clear(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = write(tmp_path, {**BASE, **change})
    with pytest.raises(ValueError) as e:
        load_scenario(path)
    text = str(e.value)
    assert text.startswith(f"scenario {path}: ")
    assert message in text
    assert "\n" not in text


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [1,\n")
    with pytest.raises(ValueError, match="not valid YAML/JSON"):
        load_scenario(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="top level must be a mapping"):
        load_scenario(lst)
    with pytest.raises(ValueError, match="unknown scenario override"):
        load_scenario(None, {"colour": 1})


def test_cli_reports_bad_scenario_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, {**BASE, "faults": [{"kind": "xid80", "node": 1}]})
    logging.disable(logging.CRITICAL)
    try:
        rc = cli.main(["simulate", "--scenario", str(path), "--bootstrap", "127.0.0.1:1"])
    finally:
        logging.disable(logging.NOTSET)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [
        f"fleetwatch simulate: scenario {path}: faults[0].kind unknown fault kind 'xid80' (known: "
        + ", ".join(KINDS)
        + ")"
    ]


def test_parse_fills_kind_defaults() -> None:
    sc = parse_scenario({**BASE, "faults": [{"kind": "ecc_sbe_rising", "node": 2, "gpu": 3, "onset_s": 5}]})
    f = sc.faults[0]
    assert set(f.params) == set(KINDS["ecc_sbe_rising"].params)
    assert all(f.params[k] == p.default for k, p in KINDS["ecc_sbe_rising"].params.items())
