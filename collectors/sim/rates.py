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


# The job-size mix of an RSC-1-like cluster (docs/reliability-definitions.md, section 6): GPUs per
# job -> (share of jobs, mean runtime in hours). OURS: an illustrative mix that meets every
# constraint the paper states (more than 40% of jobs use 1 GPU; more than 90% fit in a server yet
# use under 10% of GPU time; jobs of 256+ GPUs use 66% of it; 4k-GPU jobs are under 1% of jobs and
# 12% of GPU time; 7.2k jobs a day fill 83% of 16,384 GPUs). The paper's own per-size fractions
# exist only in its Fig. 6.
RSC1_JOB_MIX: dict[int, tuple[float, float]] = {
    1: (0.422, 1.6),
    2: (0.12, 1.9),
    4: (0.12, 1.9),
    8: (0.265, 1.2),
    16: (0.025, 3.4),
    32: (0.018, 3.1),
    64: (0.012, 4.1),
    128: (0.0085, 4.2),
    256: (0.0055, 4.8),
    512: (0.0025, 5.0),
    1024: (0.0012, 4.4),
    2048: (0.00055, 5.2),
    4096: (0.00015, 8.9),
}
RSC1_JOBS_PER_DAY = 7200.0  # on 2048 nodes

# How an infrastructure failure splits by component. OURS: the paper ranks IB links, filesystem
# mounts, GPU memory and PCIe errors first (its Fig. 4 has no numbers in the text); `node` is a
# NODE_FAIL with nothing else seen.
RSC1_COMPONENT_MIX: dict[str, float] = {
    "ib_link": 0.24,
    "filesystem_mount": 0.20,
    "gpu_memory": 0.18,
    "pcie": 0.20,  # PCIe errors and GPUs fallen off the bus (XID 79), which the paper finds together
    "nvlink": 0.07,
    "node": 0.08,
    "driver": 0.03,
}

# Ends that are not the infrastructure's, per run (RSC-1's Slurm end states, Fig. 3: FAILED 24%
# of jobs, nearly all of them the application's; CANCELLED about 3%; TIMEOUT 0.6%).
RSC1_USER_FAILURE = 0.24
RSC1_CANCELLED = 0.03
RSC1_TIMEOUT = 0.006
