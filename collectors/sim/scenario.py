"""Scenario files: what cluster to simulate, for how long, and which faults to inject.

A scenario is YAML or JSON (see scenarios/default.yaml for every field, commented). Loading
validates everything up front and raises ValueError naming the file and field, so a typo is a
one-line error from `fleetwatch simulate` rather than a surprise half-way through a run.

Node numbers in fault entries are the numbers in the node names (1..nodes: node 3 is
`gpu-node-0003`); a full node name is accepted too. GPU indices are 0-based, as in NVML.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from fleetwatch.collectors.sim import kinds, rates

log = logging.getLogger(__name__)

DEFAULT_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed, so batch runs are byte-reproducible
MAX_NODES = 65_536
MAX_DURATION_S = 366 * 86_400.0  # a year of simulated time: 1e308 s ran until killed
MAX_GPUS = 64


@dataclass(frozen=True)
class Hardware:
    """Per-node hardware; defaults are an 8x H100 SXM5 80 GB node with 8x 400 Gb/s NDR InfiniBand."""

    tdp_w: float = 700.0
    idle_power_w: float = 70.0
    max_sm_clock_mhz: int = 1980
    idle_sm_clock_mhz: int = 345
    mem_total_mib: int = 81559
    ib_ports: int = 8
    ib_rate_gbps: float = 400.0
    nvlinks: int = 18  # NVLink 4 links of an H100 SXM5
    cpus: int = 224


@dataclass(frozen=True)
class JobsConfig:
    """The scheduler's workload: multi-node synchronous data-parallel training jobs."""

    sizes: tuple[int, ...] = (2, 4, 8, 16)  # nodes per job, drawn uniformly among those that fit
    duration_s: tuple[float, float] = (600.0, 3600.0)  # uniform range of planned run time
    step_time_s: tuple[float, float] = (0.8, 2.5)  # uniform range of a job's nominal iteration time
    startup_s: tuple[float, float] = (5.0, 15.0)  # launch, data loading, compile: no steps yet
    heartbeat_s: float = 30.0  # job/1 "running" every this many seconds
    checkpoint_every_s: float = 120.0  # 0 disables checkpoints
    checkpoint_s: float = 6.0  # a checkpoint pauses training (GPUs nearly idle, disk busy)
    requeue_delay_s: float = 15.0  # epilog/cleanup before freed nodes take a new job
    idle_fraction: float = 0.0  # fraction of nodes the scheduler keeps free


@dataclass(frozen=True)
class Background:
    """Random faults drawn from published rates (rates.py), sped up by `acceleration`."""

    enabled: bool = False
    acceleration: float = 1.0  # multiplies every rate: real rates give ~0 faults in a 5-minute run
    node_failure_rate: float = rates.RSC1_FAILURES_PER_1000_NODE_DAYS
    lemon_fraction: float = rates.LEMON_NODE_FRACTION
    lemon_rate_multiplier: float = rates.LEMON_RATE_MULTIPLIER
    straggler_job_fraction: float = rates.STRAGGLER_JOB_FRACTION
    straggler_slowdown: tuple[float, float] = (0.10, 0.30)
    ramp_s: tuple[float, float] = (60.0, 300.0)  # gradual faults' time to failure (simulated seconds)
    repair_s: float | None = 600.0  # how long a background fault lasts; null = rest of run


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    node: int  # 0-based index into the node list
    onset_s: float  # seconds after the start of the run
    gpu: int | None  # per-GPU kinds (and straggler causes); None otherwise
    params: Mapping[str, Any]  # every parameter of the kind, defaults filled in
    source: str = "explicit"  # explicit | background

    @property
    def spec(self) -> kinds.KindSpec:
        return kinds.KINDS[self.kind]


@dataclass(frozen=True)
class Scenario:
    name: str = "unnamed"
    description: str = ""
    seed: int = 0
    epoch: float | None = None  # simulated start (unix s); None = DEFAULT_EPOCH in batch, now when live
    nodes: int = 32
    gpus_per_node: int = 8
    node_prefix: str = "gpu-node-"
    interval_s: float = 1.0
    duration_s: float = 300.0
    hardware: Hardware = field(default_factory=Hardware)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    background: Background = field(default_factory=Background)
    faults: tuple[FaultSpec, ...] = ()
    # How much faster than real life this scenario's history unfolds, for detectors whose
    # windows are days long (lemon scoring): a 5-minute demo that plays a lemon node's weeks
    # of repeated incidents sets e.g. 0.05, and eval/demo scale those windows by it.
    detector_time_scale: float = 1.0

    @property
    def n_ticks(self) -> int:
        # A tiny epsilon so that 10.0 / 0.1 gives 100 ticks, not 99.
        return max(1, math.floor(self.duration_s / self.interval_s + 1e-9))

    def node_name(self, index: int) -> str:
        return f"{self.node_prefix}{index + 1:04d}"


# ---------------------------------------------------------------- parsing


class _OutsideRun(ValueError):
    """A fault placed on a node, GPU or time that the (possibly overridden) run does not have."""


class _Err:
    """Builds error messages that name the scenario source and the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, where: str, what: str, cls: type[ValueError] = ValueError) -> ValueError:
        return cls(f"scenario {self.source}: {where} {what}")


def _shown(v: Any) -> str:
    """A value for an error message: a scalar as written (cut short), a structure by its type only. A
    structure's repr renders it out in full: one built from YAML anchors, each level nine
    references to the one below, is billions of items."""
    if isinstance(v, str | int | float | bool) or v is None:
        return repr(v)[:80]
    return f"a {type(v).__name__}"


def _text(err: _Err, where: str, v: Any) -> str:
    if not isinstance(v, str):
        raise err(where, f"must be a string, got {_shown(v)}")
    return v


def _num(err: _Err, where: str, v: Any, lo: float | None = None, hi: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise err(where, f"must be a number, got {_shown(v)}")
    if lo is not None and v < lo:
        raise err(where, f"must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise err(where, f"must be <= {hi}, got {v}")
    return float(v)


def _int(err: _Err, where: str, v: Any, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise err(where, f"must be an integer, got {_shown(v)}")
    if lo is not None and v < lo:
        raise err(where, f"must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise err(where, f"must be <= {hi}, got {v}")
    return v


def _range(err: _Err, where: str, v: Any, lo: float = 0.0) -> tuple[float, float]:
    if isinstance(v, int | float) and not isinstance(v, bool):
        x = _num(err, where, v, lo)
        return (x, x)
    if not isinstance(v, list | tuple) or len(v) != 2:
        raise err(where, f"must be a number or a [low, high] pair, got {_shown(v)}")
    a, b = _num(err, f"{where}[0]", v[0], lo), _num(err, f"{where}[1]", v[1], lo)
    if b < a:
        raise err(where, f"low {a} is above high {b}")
    return (a, b)


def _mapping(err: _Err, where: str, v: Any) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise err(where, f"must be a mapping, got {type(v).__name__}")
    return v


def _unknown(err: _Err, where: str, obj: Mapping[str, Any], allowed: set[str]) -> None:
    # keys as text: YAML reads `yes:` as True, and sorting True beside strings raised TypeError
    extra = sorted(_shown(k) if not isinstance(k, str) else k for k in set(obj) - allowed)
    if extra:
        raise err(where, f"has unknown field(s) {extra} (allowed: {sorted(allowed)})")


def _section(err: _Err, where: str, raw: Any, cls: type, ranges: set[str] = frozenset()) -> Any:
    """Parse a flat dataclass section, type-checking each value against its default's type."""
    obj = _mapping(err, where, raw)
    names = {f.name for f in fields(cls)}
    _unknown(err, where, obj, names)
    defaults = cls()
    values: dict[str, Any] = {}
    for name, v in obj.items():
        d = getattr(defaults, name)
        w = f"{where}.{name}"
        if name in ranges:
            values[name] = _range(err, w, v)
        elif isinstance(d, bool):
            if not isinstance(v, bool):
                raise err(w, f"must be true or false, got {_shown(v)}")
            values[name] = v
        elif isinstance(d, tuple):  # a list of positive integers (job sizes)
            if not isinstance(v, list) or not v:
                raise err(w, f"must be a non-empty list, got {_shown(v)}")
            values[name] = tuple(_int(err, f"{w}[{i}]", x, 1, MAX_NODES) for i, x in enumerate(v))
        elif isinstance(d, int):
            values[name] = _int(err, w, v, 0)
        elif v is None and name == "repair_s":
            values[name] = None
        else:
            values[name] = _num(err, w, v, 0.0)
    return cls(**values)


def _fault(err: _Err, i: int, raw: Any, sc: dict[str, Any], names: dict[str, int]) -> FaultSpec:
    where = f"faults[{i}]"
    obj = _mapping(err, where, raw)
    if "kind" not in obj:
        raise err(where, "needs a `kind`")
    try:
        spec = kinds.kind(obj["kind"]) if isinstance(obj["kind"], str) else kinds.kind(_shown(obj["kind"]))
    except ValueError as e:
        raise err(f"{where}.kind", str(e)) from None
    where = f"faults[{i}] ({spec.name})"
    common = {"kind", "node", "onset_s", "gpu"}
    _unknown(err, where, obj, common | set(spec.params))

    if "node" not in obj:
        raise err(where, "needs a `node` (1..nodes, or a node name)")
    node_raw = obj["node"]
    if isinstance(node_raw, str):
        if node_raw not in names:
            raise err(f"{where}.node", f"{_shown(node_raw)} is not a node of this cluster", _OutsideRun)
        node = names[node_raw]
    else:
        node = _int(err, f"{where}.node", node_raw, 1) - 1
        if node >= sc["nodes"]:
            raise err(
                f"{where}.node",
                f"{node + 1} is out of range: the cluster has {sc['nodes']} nodes",
                _OutsideRun,
            )

    onset = _num(err, f"{where}.onset_s", obj.get("onset_s", 0.0), 0.0)
    if onset >= sc["duration_s"]:
        raise err(
            f"{where}.onset_s",
            f"{onset} is not before the end of the run ({sc['duration_s']} s)",
            _OutsideRun,
        )

    gpu: int | None = None
    uses_gpu = spec.per_gpu or spec.name == "straggler"
    if "gpu" in obj:
        if not uses_gpu:
            raise err(f"{where}.gpu", f"does not apply: {spec.name} is a node-level fault")
        gpu = _int(err, f"{where}.gpu", obj["gpu"], 0)
        if gpu >= sc["gpus_per_node"]:
            raise err(
                f"{where}.gpu", f"{gpu} is out of range: nodes have {sc['gpus_per_node']} GPUs", _OutsideRun
            )
    elif spec.per_gpu:
        gpu = 0

    params: dict[str, Any] = {}
    for name, p in spec.params.items():
        v = obj.get(name, p.default)
        w = f"{where}.{name}"
        if v is None and p.nullable:
            params[name] = None
        elif p.type is bool:
            if not isinstance(v, bool):
                raise err(w, f"must be true or false, got {_shown(v)}")
            params[name] = v
        elif p.type is str:
            if p.choices and v not in p.choices:
                raise err(w, f"must be one of {list(p.choices)}, got {_shown(v)}")
            params[name] = v
        elif p.type is int:
            params[name] = _int(
                err, w, v, None if p.lo is None else int(p.lo), None if p.hi is None else int(p.hi)
            )
        else:
            params[name] = _num(err, w, v, p.lo, p.hi)

    if "port" in params and params["port"] >= sc["ib_ports"]:
        raise err(f"{where}.port", f"{params['port']} is out of range: nodes have {sc['ib_ports']} IB ports")
    if spec.name == "straggler" and params["cause"] != "none" and gpu is None:
        gpu = 0  # the GPU whose clock explains the slowness
    gradual_fail = spec.category == "gradual" and params["fail"] and params["duration_s"] is not None
    if gradual_fail and params["duration_s"] <= params["ramp_s"]:
        raise err(
            f"{where}.duration_s",
            f"{params['duration_s']} must exceed ramp_s {params['ramp_s']} (it would end before it fails)",
        )
    return FaultSpec(spec.name, node, onset, gpu, params)


_TOP = {
    "name",
    "description",
    "seed",
    "epoch",
    "nodes",
    "gpus_per_node",
    "node_prefix",
    "interval_s",
    "duration_s",
    "hardware",
    "jobs",
    "background",
    "faults",
    "detector_time_scale",
}


def parse_scenario(raw: Any, source: str = "<dict>", overridden: frozenset[str] = frozenset()) -> Scenario:
    """Validate a decoded scenario document. Faults that fall outside a cluster or run made smaller
    by a command-line override (`overridden`) are dropped with a warning instead of failing."""
    err = _Err(source)
    doc = _mapping(err, "top level", raw)
    _unknown(err, "top level", doc, _TOP)
    hw = _section(err, "hardware", doc.get("hardware"), Hardware)
    if hw.ib_ports < 1:
        raise err("hardware.ib_ports", "must be >= 1")
    if hw.idle_power_w >= hw.tdp_w:
        raise err("hardware.idle_power_w", f"must be below tdp_w {hw.tdp_w}")
    jobs = _section(err, "jobs", doc.get("jobs"), JobsConfig, {"duration_s", "step_time_s", "startup_s"})
    if jobs.step_time_s[0] <= 0:
        raise err("jobs.step_time_s", "must be > 0")
    if jobs.idle_fraction >= 1:
        raise err("jobs.idle_fraction", "must be below 1")
    bg = _section(err, "background", doc.get("background"), Background, {"straggler_slowdown", "ramp_s"})
    if bg.lemon_fraction > 1 or bg.straggler_job_fraction > 1:
        raise err("background", "fractions must be <= 1")

    sc: dict[str, Any] = {
        # strings as written: str() of a structure built from YAML anchors (each level nine
        # references to the one below) renders it out in full, billions of items
        "name": _text(err, "name", doc.get("name", Path(source).stem)),
        "description": _text(err, "description", doc.get("description", "")),
        "seed": _int(err, "seed", doc.get("seed", 0), 0),
        "epoch": None if doc.get("epoch") is None else _num(err, "epoch", doc["epoch"], 0.0),
        "nodes": _int(err, "nodes", doc.get("nodes", 32), 1, MAX_NODES),
        "gpus_per_node": _int(err, "gpus_per_node", doc.get("gpus_per_node", 8), 1, MAX_GPUS),
        "node_prefix": doc.get("node_prefix", "gpu-node-"),
        "interval_s": _num(err, "interval_s", doc.get("interval_s", 1.0), 0.01, 3600.0),
        "duration_s": _num(err, "duration_s", doc.get("duration_s", 300.0), 0.01, MAX_DURATION_S),
        "detector_time_scale": _num(
            err, "detector_time_scale", doc.get("detector_time_scale", 1.0), 1e-6, 1.0
        ),
    }
    prefix = sc["node_prefix"]
    if not isinstance(prefix, str) or not prefix or not (prefix[0].isalnum() and prefix.isascii()):
        raise err("node_prefix", f"must be a plain name prefix like 'gpu-node-', got {_shown(prefix)}")
    if sc["duration_s"] < sc["interval_s"]:
        raise err("duration_s", f"{sc['duration_s']} is shorter than one interval ({sc['interval_s']} s)")
    sc["ib_ports"] = hw.ib_ports

    probe = Scenario(node_prefix=prefix)
    names = {probe.node_name(i): i for i in range(sc["nodes"])}
    raw_faults = doc.get("faults") or []
    if not isinstance(raw_faults, list):
        raise err("faults", f"must be a list, got {type(raw_faults).__name__}")
    faults = []
    dropped: list[str] = []
    lenient = overridden & {"nodes", "gpus_per_node", "duration_s"}
    for i, f in enumerate(raw_faults):
        try:
            faults.append(_fault(err, i, f, sc, names))
        except _OutsideRun as e:
            # A fault on node 20 of a 32-node scenario run with --nodes 16 is not a broken file.
            if not lenient:
                raise ValueError(str(e)) from None
            dropped.append(str(e).removeprefix(f"scenario {source}: ").split(")", 1)[0] + ")")
    if dropped:
        log.warning(
            "scenario %s: %d of %d faults fall outside the overridden %s and are dropped: %s",
            source,
            len(dropped),
            len(raw_faults),
            "/".join(sorted(lenient)),
            ", ".join(dropped),
        )
    del sc["ib_ports"]
    return Scenario(**sc, hardware=hw, jobs=jobs, background=bg, faults=tuple(faults))


_OVERRIDE_KEYS = {"nodes": "nodes", "gpus": "gpus_per_node", "seed": "seed", "duration": "duration_s"}


def load_scenario(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Load a scenario file (YAML or JSON; None = the packaged default) and apply overrides.

    `overrides` take the CLI's names (nodes, gpus, seed, duration) or scenario field names;
    None values are ignored. Raises FileNotFoundError or ValueError with a one-line reason.
    """
    if path is None:
        source = "default.yaml"
        text = (
            importlib.resources.files("fleetwatch.collectors.sim")
            .joinpath("scenarios/default.yaml")
            .read_text("utf-8")
        )
    else:
        p = Path(path)
        source = str(p)
        if not p.exists():
            raise FileNotFoundError(f"scenario file {p} does not exist")
        if not p.is_file():
            raise ValueError(f"scenario {p}: not a regular file")
        try:
            text = p.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as e:  # no permission, an I/O error, not UTF-8
            raise ValueError(f"scenario {p}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        doc = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"scenario {source}: not valid YAML/JSON ({first})") from None
    except RecursionError:  # thousands of levels: no scenario's shape
        raise ValueError(f"scenario {source}: not valid YAML/JSON (nested too deeply)") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValueError(f"scenario {source}: top level must be a mapping, got {type(doc).__name__}")
    doc = dict(doc)
    overridden: set[str] = set()
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        target = _OVERRIDE_KEYS.get(key, key)
        if target not in _TOP:
            raise ValueError(f"unknown scenario override {key!r}")
        doc[target] = value
        overridden.add(target)
    return parse_scenario(doc, source, frozenset(overridden))


def packaged_scenarios() -> list[str]:
    """Names of the scenario files shipped with the package."""
    root = importlib.resources.files("fleetwatch.collectors.sim").joinpath("scenarios")
    return sorted(p.name for p in root.iterdir() if p.name.endswith(".yaml"))


def packaged_path(name: str) -> Path:
    """Filesystem path of a packaged scenario (e.g. 'healthy.yaml'), for load_scenario()."""
    return Path(str(importlib.resources.files("fleetwatch.collectors.sim").joinpath("scenarios", name)))
