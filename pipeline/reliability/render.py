"""The reliability report as files: Markdown (report.md, with its plots as SVG files beside it)
and one self-contained HTML page (report.html: the plots inlined as data: URIs, no script, no
fetch), for SRE leads to read and pass around.

Plots (matplotlib, SVG): MTTF against job size with the series projection and its band from
r_f's interval; infrastructure failures by component per day; the ETTR of long jobs against the
expected-ETTR curve; GPU-hours lost by cause; lemon nodes and their signals.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fleetwatch.plain_text import clean_text

Plot = Callable[[dict[str, Any]], "Any"]


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a"
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


# ---------------------------------------------------------------------- plots


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    return fig, ax


def _nothing(ax: Any, what: str) -> None:
    """An empty plot says why it is empty."""
    ax.text(0.5, 0.5, what, ha="center", transform=ax.transAxes)


def plot_mttf(r: dict[str, Any]) -> Any:
    fig, ax = _figure()
    rows = [
        x
        for x in r["mttf_by_gpus"]
        if x["mttf_h"] and x["ci_low_h"] is not None and x["ci_high_h"] is not None
    ]
    if rows:
        g = np.array([x["gpus"] for x in rows], dtype=float)
        m = np.array([x["mttf_h"] for x in rows])
        lo = np.array([x["ci_low_h"] for x in rows])
        hi = np.array([x["ci_high_h"] for x in rows])
        ax.errorbar(g, m, yerr=[m - lo, hi - m], fmt="o", capsize=3, label="measured (95% CI)")
    rf = r["r_f_per_1000_node_days"]
    sizes = np.array([x["gpus"] for x in r["mttf_by_gpus"]] or [8], dtype=float)
    grid = np.geomspace(max(1.0, sizes.min()), max(16384.0, sizes.max()), 50)
    nodes = np.maximum(grid / 8, 1)
    if rf["total"]:
        ax.plot(grid, 24 * 1000 / (nodes * rf["total"]), "-", label=f"projected, r_f = {rf['total']:.2f}")
        if rf["ci_low"] and rf["ci_high"]:
            ax.fill_between(
                grid,
                24 * 1000 / (nodes * rf["ci_high"]),
                24 * 1000 / (nodes * rf["ci_low"]),
                alpha=0.2,
                label="projection's 95% band",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("job size (GPUs)")
    ax.set_ylabel("job MTTF (hours)")
    ax.set_title("Job mean time to failure by size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def plot_failures_over_time(r: dict[str, Any]) -> Any:
    fig, ax = _figure()
    days = r["failures_by_day"]["days"]
    series = r["failures_by_day"]["series"]
    if days and series:
        x = [dt.datetime.fromtimestamp(d, tz=dt.UTC) for d in days]
        bottom = np.zeros(len(days))
        for comp, counts in sorted(series.items()):
            ax.bar(x, counts, bottom=bottom, label=comp, width=0.9)
            bottom += np.array(counts)
        ax.legend(fontsize="small", ncol=2)
    else:
        _nothing(ax, "no infrastructure failures in this range")
    ax.set_ylabel("infrastructure failures per day")
    ax.set_title("Failures by component over time")
    fig.autofmt_xdate()
    return fig


def plot_ettr(r: dict[str, Any]) -> Any:
    fig, ax = _figure()
    jobs = r["ettr"]["jobs"]
    if jobs:
        ax.scatter(
            [j["gpus"] for j in jobs], [j["ettr"] for j in jobs], s=10, alpha=0.5, label="measured, per job"
        )
    curve = r["ettr"]["expected"]["curve"]
    if curve:
        ax.plot(
            [c["gpus"] for c in curve],
            [c["expected_ettr"] for c in curve],
            "-",
            label="expected (checkpoint interval as set)",
        )
        ax.plot(
            [c["gpus"] for c in curve],
            [c["expected_ettr_at_young_daly"] for c in curve],
            "--",
            label="expected at the Young/Daly interval",
        )
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("job size (GPUs)")
    ax.set_ylabel("ETTR")
    ax.set_title(f"Effective training time ratio (jobs of at least {r['ettr']['min_hours']:g} h)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def plot_lost(r: dict[str, Any]) -> Any:
    fig, ax = _figure()
    lost = r["lost_gpu_hours_by_cause"]
    bars: dict[str, float] = {}
    for kind in ("lost_progress", "restart"):
        for cause, v in lost[kind].items():
            bars[f"{kind}: {cause}"] = v
    if lost["drained"]:
        bars["drained nodes"] = lost["drained"]
    if bars:
        names = sorted(bars, key=bars.__getitem__)
        ax.barh(names, [bars[n] for n in names])
    else:
        _nothing(ax, "no GPU-hours lost in this range")
    ax.set_xlabel("GPU-hours")
    ax.set_title("GPU-hours lost by cause")
    fig.tight_layout()
    return fig


def plot_lemons(r: dict[str, Any]) -> Any:
    fig, ax = _figure()
    rows = r["lemons"]["lemons"][:20]
    if rows:
        names = [x["node"] for x in rows]
        y = np.arange(len(rows))
        left = np.zeros(len(rows))
        for key, label in (
            ("single_node_fails", "single-node job failures"),
            ("multi_node_fails", "multi-node job failures"),
            ("out_count", "drains"),
        ):
            v = np.array([x[key] for x in rows], dtype=float)
            ax.barh(y, v, left=left, label=label)
            left += v
        ax.set_yticks(y, names)
        ax.legend()
    else:
        _nothing(ax, "no lemon nodes in this range")
    ax.set_xlabel("events blamed on the node")
    ax.set_title("Lemon nodes")
    fig.tight_layout()
    return fig


PLOTS: list[tuple[str, str, Plot]] = [
    ("mttf", "Job MTTF by size", plot_mttf),
    ("failures", "Failures by component over time", plot_failures_over_time),
    ("ettr", "ETTR against the expected ETTR", plot_ettr),
    ("lost", "GPU-hours lost by cause", plot_lost),
    ("lemons", "Lemon nodes", plot_lemons),
]


def svg(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


# ---------------------------------------------------------------------- text


def sections(r: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, table header, table rows, note) of each section: the same content in both formats."""
    rf = r["r_f_per_1000_node_days"]
    out = []
    tax = r["taxonomy"]
    out.append(
        (
            "Job ends",
            ["category", "runs", "GPU-hours"],
            [
                [c, _fmt(n), _fmt(tax["gpu_hours_by_category"].get(c, 0.0))]
                for c, n in sorted(tax["by_category"].items())
            ],
            f"{tax['runs']:,} runs ended in this range. Infrastructure failures by component: "
            + (", ".join(f"{c} {n}" for c, n in sorted(tax["infra_failures_by_component"].items())) or "none")
            + ".",
        )
    )
    out.append(
        (
            "Failure rate r_f (per 1000 node-days)",
            ["scope", "r_f", "95% CI", "failures", "node-days"],
            [
                [
                    rf["rule"],
                    _fmt(rf["total"]),
                    f"{_fmt(rf['ci_low'])} to {_fmt(rf['ci_high'])}",
                    _fmt(rf["failures"]),
                    _fmt(rf["node_days"], 1),
                ],
                [
                    rf["all_sizes"]["rule"],
                    _fmt(rf["all_sizes"]["total"]),
                    f"{_fmt(rf['all_sizes']['ci_low'])} to {_fmt(rf['all_sizes']['ci_high'])}",
                    _fmt(rf["all_sizes"]["failures"]),
                    _fmt(rf["all_sizes"]["node_days"], 1),
                ],
            ]
            + [[f"component {c}", _fmt(v), "", "", ""] for c, v in sorted(rf["by_component"].items())],
            "The paper reports 6.50 on RSC-1 and 2.34 on RSC-2.",
        )
    )
    out.append(
        (
            "Job MTTF by size",
            ["GPUs", "runs", "failures", "MTTF (h)", "95% CI (h)", "projected (h)"],
            [
                [
                    str(x["gpus"]),
                    _fmt(x["jobs"]),
                    _fmt(x["failures"]),
                    _fmt(x["mttf_h"]),
                    f"{_fmt(x['ci_low_h'])} to {_fmt(x['ci_high_h'])}",
                    _fmt(x["projected_mttf_h"]),
                ]
                for x in r["mttf_by_gpus"]
            ],
            "Projected: MTTF = 1 / (nodes x r_f), a job as its nodes in series.",
        )
    )
    e = r["ettr"]
    vals = np.array([j["ettr"] for j in e["jobs"]])
    p = e["expected"]
    out.append(
        (
            "ETTR",
            ["GPUs", "expected ETTR", "Young/Daly interval (min)", "expected at Young/Daly"],
            [
                [
                    str(c["gpus"]),
                    _fmt(c["expected_ettr"], 3),
                    _fmt((c["young_daly_interval_s"] or 0) / 60, 1),
                    _fmt(c["expected_ettr_at_young_daly"], 3),
                ]
                for c in p["curve"]
            ],
            (
                f"{len(vals)} jobs of at least {e['min_hours']:g} h; measured ETTR median "
                f"{_fmt(float(np.median(vals)), 3) if len(vals) else 'n/a'}. "
                "Model parameters: checkpoint every "
                f"{p['ckpt_interval_s'] / 60:g} min, restart overhead {p['restart_overhead_s'] / 60:.1f} min"
                f"{' (measured)' if p['restart_overhead_measured'] else ' (assumed)'}, checkpoint write "
                f"{p['ckpt_write_s'] / 60:.1f} min"
                f"{' (measured)' if p['ckpt_write_measured'] else ' (assumed)'}, queue after "
                f"a failure {p['queue_after_failure_s'] / 60:.1f} min."
            ),
        )
    )
    lost = r["lost_gpu_hours_by_cause"]
    out.append(
        (
            "GPU-hours lost",
            ["kind", "cause", "GPU-hours"],
            [[k, c, _fmt(v)] for k in ("lost_progress", "restart") for c, v in sorted(lost[k].items())]
            + [["drained", "nodes drained", _fmt(lost["drained"])]],
            f"Total {_fmt(lost['total'])} GPU-hours; "
            f"{lost['assumed_lost_progress_runs']} failed runs reported no "
            "checkpoint, so their loss is the assumed half checkpoint interval.",
        )
    )
    lem = r["lemons"]
    ba = lem["before_after"]
    note = f"Fleet rate {lem['fleet_rate_per_node']} events per node over {lem['nodes']} nodes."
    if ba:
        note += (
            f" Jobs of {ba['large_job_gpus']}+ GPUs failed "
            f"{_fmt(ba['before']['failure_share'], 3)} of the time "
            f"before the first lemon drain and {_fmt(ba['after']['failure_share'], 3)} after the last."
        )
    out.append(
        (
            "Lemon nodes",
            [
                "node",
                "single-node fails",
                "single-node rate",
                "multi-node fails",
                "drains",
                "XIDs",
                "failures/day before, after its drain",
                "tail p",
                "by",
            ],
            [
                [
                    x["node"],
                    _fmt(x["single_node_fails"]),
                    _fmt(x["single_node_failure_rate"], 3),
                    _fmt(x["multi_node_fails"]),
                    _fmt(x["out_count"]),
                    _fmt(x["xid_count"]),
                    ", ".join(
                        _fmt(x[k], 3)
                        for k in ("failures_per_day_before_drain", "failures_per_day_after_drain")
                    ),
                    f"{x['tail_p']:.2g}",
                    x["by"],
                ]
                for x in lem["lemons"]
            ],
            note,
        )
    )
    out.append(
        (
            "Data quality",
            ["what", "count", "examples"],
            [[q["what"], _fmt(q["count"]), "; ".join(q["examples"][:3])] for q in r["data_quality"]],
            "Lines here are inputs the figures left out or corrected; none means every input was usable.",
        )
    )
    return out


# what Markdown (or the HTML it may pass through) reads as markup, escaped with a backslash
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+!|~])")


def _md_cell(s: str) -> str:
    """A table cell's text as Markdown shows it literally: one line, every markup character
    escaped. Data-quality examples quote what others sent (a step record's job name): a link or a
    tag in one is text."""
    return _MD_SPECIAL.sub(r"\\\1", clean_text(s, 1000))


def markdown(r: dict[str, Any], images: dict[str, str]) -> str:
    lines = [f"# Reliability report, {_when(r['since'])} to {_when(r['until'])}", ""]
    for title, head, rows, note in sections(r):
        lines += [f"## {title}", "", note, ""]
        if rows:
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            lines.append("")
    lines += ["## Plots", ""]
    for name, title, _ in PLOTS:
        lines += [f"![{title}]({images[name]})", ""]
    return "\n".join(lines)


def html_page(r: dict[str, Any], plots: dict[str, bytes]) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Reliability report {e(_when(r['since']))} to {e(_when(r['until']))}</title>",
        "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
        "th{background:#f3f3f3}img{max-width:100%}</style></head><body>",
        f"<h1>Reliability report, {e(_when(r['since']))} to {e(_when(r['until']))}</h1>",
    ]
    for title, head, rows, note in sections(r):
        parts.append(f"<h2>{e(title)}</h2><p>{e(note)}</p>")
        if rows:
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows]
            parts.append("</table>")
    parts.append("<h2>Plots</h2>")
    for name, title, _ in PLOTS:
        data = base64.b64encode(plots[name]).decode()
        parts.append(
            f"<figure><img id='plot-{name}' alt='{e(title)}' src='data:image/svg+xml;base64,{data}'>"
            f"<figcaption>{e(title)}</figcaption></figure>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def write(r: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    plots = {name: svg(make(r)) for name, _, make in PLOTS}
    images = {}
    for name, data in plots.items():
        (out / f"{name}.svg").write_bytes(data)
        images[name] = f"{name}.svg"
    (out / "report.md").write_text(markdown(r, images))
    (out / "report.html").write_text(html_page(r, plots))
    return {"markdown": out / "report.md", "html": out / "report.html"}
