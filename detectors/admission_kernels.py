"""The compiled pass of detectors/node_index.py: which samples of a batch are new, in arrival order.

A node's agent numbers its samples (`seq`) and says which instance numbered them (`agent.instance`:
a new install or a lost spool starts a new instance and a new sequence). That numbering, not the
node's clock, says which sample is newer: a clock is only a label, and one that jumps must neither
hide the next real sample nor make an old one look new (issue 23, item 1).

Per node row the state is the current instance's code, the one before it (a retired instance),
the last accepted seq, and the node's event time: the latest accepted sample time, which never goes
back. A sample is new when
- its node has no sample yet;
- it comes from the current instance with a higher seq;
- it comes from an instance other than the current and the retired one: a new sequence starts
  (a reinstall, a lost spool);
- it carries no instance (an older agent, the simulator) and its seq or its time is higher: an
  agent without an instance id that restarts its sequence is known only by its clock moving on;
- the node's seq is not known (state restored from a snapshot written before seq was kept) and
  its time is later than the node's (its instance and seq are known from then on).
Anything else is a duplicate (at-least-once delivery makes them normal) or a late sample.

A new sample's event time is its own time, except that
- it is never later than the broker's append time plus `lead_s` (a sample cannot reach the broker
  before it was taken, so a clock ahead of that is wrong; where the broker time is not known, as
  in `fleetwatch eval`, there is no such bound), and
- it is never earlier than the node's event time (a clock that went back): detectors see each
  node's samples in non-decreasing time, and the sample's events (XIDs, counter steps) still count.
`jump` is the sample's own time minus its event time: > 0 a clock ahead, < 0 a clock behind.

Compiled once, cached by numba beside this file; allocates nothing, never raises, releases the GIL.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def admission_pass(  # state and outputs are passed in, so that nothing is allocated
    rows: np.ndarray,
    instance: np.ndarray,
    seq: np.ndarray,
    ts: np.ndarray,
    received: np.ndarray,
    lead_s: float,
    cur_instance: np.ndarray,
    old_instance: np.ndarray,
    last_seq: np.ndarray,
    last_ts: np.ndarray,
    keep: np.ndarray,
    event_ts: np.ndarray,
    jump: np.ndarray,
) -> None:
    """The rules of the module docstring, sample by sample in arrival order. `keep` arrives False,
    `event_ts` and `jump` NaN; state rows exist for every row in `rows` (last_ts NaN: no sample
    yet; last_seq -1: not known)."""
    for i in range(len(rows)):
        r = rows[i]
        t = ts[i]
        bound = received[i] + lead_s  # NaN where the broker time is not known: no bound
        own = bound if t > bound else t
        known = last_ts[r]
        if math.isnan(known):
            new = True
        elif last_seq[r] < 0:  # restored from before seq was kept: time alone, as then
            new = own > known
        elif instance[i] == 0:  # no instance id: a higher seq, or a restarted sequence
            new = seq[i] > last_seq[r] or own > known
        elif instance[i] == cur_instance[r]:
            new = seq[i] > last_seq[r]
        else:  # another instance: a new sequence, unless it is the one the current one replaced
            new = instance[i] != old_instance[r]
        if new and instance[i] != cur_instance[r]:
            old_instance[r] = cur_instance[r]
        if not new:
            continue
        keep[i] = True
        e = own if (math.isnan(known) or own > known) else known
        event_ts[i] = e
        jump[i] = t - e
        last_ts[r] = e
        last_seq[r] = seq[i]
        cur_instance[r] = instance[i]


def warm_up() -> None:
    """Load the kernel from numba's cache, compiling it first if there is none (a few seconds)."""
    one = np.zeros(1, dtype=np.int64)
    admission_pass(
        one,
        one.copy(),
        one.copy(),
        np.zeros(1),
        np.full(1, np.nan),
        2.0,
        one.copy(),
        one.copy(),
        np.full(1, -1, dtype=np.int64),
        np.full(1, np.nan),
        np.zeros(1, dtype=np.bool_),
        np.full(1, np.nan),
        np.full(1, np.nan),
    )
