"""The demo's picture: node health over time, injected faults and first findings marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fleetwatch.pipeline.fleet_metrics import HEALTH_BY_SEVERITY as HEALTH  # the same levels Grafana shows


def health_grid(
    findings: list[dict[str, Any]], nodes: list[str], start: float, end: float, step: float
) -> tuple[np.ndarray, np.ndarray]:
    """(times (T,), health (N, T)): 1 = no open finding, else the worst open finding's level."""
    times = np.arange(start, end + step, step)
    grid = np.ones((len(nodes), len(times)))
    row = {n: i for i, n in enumerate(nodes)}
    # each finding id: a sequence of (ts, severity, resolved) emissions
    by_id: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(findings, key=lambda f: f["ts"]):
        by_id.setdefault(f["id"], []).append(f)
    for emissions in by_id.values():
        r = row.get(emissions[0]["node"])
        if r is None:
            continue
        for i, f in enumerate(emissions):
            if f["resolved"]:
                break
            until = emissions[i + 1]["ts"] if i + 1 < len(emissions) else end
            cols = (times >= f["ts"]) & (times <= until)
            grid[r, cols] = np.minimum(grid[r, cols], HEALTH[f["severity"]])
    return times, grid


def plot_fleet(
    findings: list[dict[str, Any]],
    truths: list[dict[str, Any]],
    nodes: list[str],
    start: float,
    end: float,
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = max(1.0, (end - start) / 600)
    times, grid = health_grid(findings, nodes, start, end, step)
    fig, ax = plt.subplots(figsize=(12, max(4, 0.22 * len(nodes) + 1.5)))
    im = ax.imshow(
        grid,
        aspect="auto",
        cmap="RdYlGn",
        vmin=0,
        vmax=1,
        interpolation="nearest",
        extent=(0, times[-1] - start, len(nodes) - 0.5, -0.5),
    )
    row = {n: i for i, n in enumerate(nodes)}
    onsets = [
        (t["onset_ts"] - start, row[t["node"]]) for t in truths if t["node"] in row and "end_ts" not in t
    ]
    if onsets:
        x, y = zip(*onsets, strict=True)
        ax.scatter(x, y, marker="x", color="black", s=40, label="fault injected")
    first: dict[str, float] = {}
    for f in findings:
        if not f["resolved"] and f["node"] in row:
            first[f["node"]] = min(first.get(f["node"], np.inf), f["ts"])
    if first:
        ax.scatter(
            [t - start for t in first.values()],
            [row[n] for n in first],
            marker="o",
            facecolors="none",
            edgecolors="blue",
            s=60,
            label="first finding",
        )
    ax.set_yticks(range(len(nodes)))
    ax.set_yticklabels(nodes, fontsize=6 if len(nodes) > 40 else 8)
    ax.set_xlabel("simulated seconds")
    ax.set_title("fleetwatch demo: node health (green healthy, yellow warning, red critical)")
    fig.colorbar(im, ax=ax, label="health score", fraction=0.03)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
