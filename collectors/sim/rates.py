"""Published failure figures that calibrate the simulator's background faults (docs/contract.md,
"Reference figures"). Only constants and unit conversions live here, so the
numbers and their sources can be read in one place.
"""

from __future__ import annotations

SECONDS_PER_DAY = 86_400.0

# Node failure rate r_f in failures per 1000 node-days. Kokolis et al., "Revisiting Reliability in
# Large-Scale Machine Learning Research Clusters", HPCA 2025: RSC-1 6.50, RSC-2 2.34.
RSC1_FAILURES_PER_1000_NODE_DAYS = 6.50
RSC2_FAILURES_PER_1000_NODE_DAYS = 2.34

# Lemon nodes: ~1.2% of nodes (Kokolis et al.). Removing them cut 512+ GPU job failures from 14%
# to 4%, i.e. ~71% of those failures came from 1.2% of nodes: per node that is
# (0.714 / 0.012) / (0.286 / 0.988) ~ 200x the failure rate of the other nodes. This multiplier
# is our derivation from those two figures, not a published number.
LEMON_NODE_FRACTION = 0.012
LEMON_RATE_MULTIPLIER = 200.0

# Stragglers: 42.5% of jobs at least 10% slower (ByteDance, OSDI'25).
STRAGGLER_JOB_FRACTION = 0.425

# Root causes of the 419 unplanned interruptions of Llama 3 405B pre-training (16k H100, 54 days;
# "The Llama 3 Herd of Models", 2024), in percent. The smaller categories (15.2% together) are
# left out; the mix is renormalised over these.
LLAMA3_ROOT_CAUSES: dict[str, float] = {
    "faulty_gpu": 30.1,
    "gpu_hbm3": 17.2,
    "software": 12.9,
    "network_switch_cable": 8.4,
    "host_maintenance": 7.6,
    "gpu_sram": 4.5,
    "gpu_system_processor": 4.1,
}

# How each root cause shows up as our fault kinds (weights within a cause). These splits are
# modelling choices: a "faulty GPU" is sometimes lost outright, sometimes degrades first.
CAUSE_TO_KINDS: dict[str, dict[str, float]] = {
    "faulty_gpu": {"xid79": 0.40, "nvlink_crc": 0.25, "pcie_replay": 0.20, "thermal": 0.15},
    "gpu_hbm3": {"xid48": 0.35, "ecc_sbe_rising": 0.35, "row_remap_pending": 0.30},
    "software": {"sw_crash": 1.0},
    "network_switch_cable": {"ib_link_down": 0.6, "ib_symbol_errors": 0.4},
    "host_maintenance": {"node_down": 1.0},
    "gpu_sram": {"xid94": 0.5, "xid95": 0.5},  # uncorrectable SRAM ECC, contained or not
    "gpu_system_processor": {"xid119": 1.0},
}


def kind_mix() -> dict[str, float]:
    """Probability that a random node fault is of each kind (sums to 1)."""
    total = sum(LLAMA3_ROOT_CAUSES.values())
    mix: dict[str, float] = {}
    for cause, pct in LLAMA3_ROOT_CAUSES.items():
        for k, w in CAUSE_TO_KINDS[cause].items():
            mix[k] = mix.get(k, 0.0) + pct / total * w
    return mix


def per_node_second(failures_per_1000_node_days: float) -> float:
    """Convert a rate in failures per 1000 node-days into failures per node-second."""
    return failures_per_1000_node_days / 1000.0 / SECONDS_PER_DAY
