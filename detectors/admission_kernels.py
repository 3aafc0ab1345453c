"""The compiled pass of detectors/node_index.py: which samples of a batch are new, in arrival order.

A node's agent numbers its samples (`seq`) and says which instance numbered them (`agent.instance`:
a new install or a lost spool starts a new instance and a new sequence). That numbering, not the
node's clock, says which sample is newer: a clock is only a label, and one that jumps must neither
hide the next real sample nor make an old one look new (issue 23, item 1).

Per node row the state is the current instance's code and its last accepted seq, the instance
before it and that one's last seq, and the node's event time: the latest accepted sample time,
which never goes back. A sample is new when
- its node has no sample yet;
- it comes from the current instance, or from the one before it, with a higher seq than that
  instance's last (the one before it then becomes current again: a sample whose instance is not
  the agent's, a stray or a forged one, makes the agent's own the one before, and must not lock
  the node's real samples out);
- it carries no instance (an older agent, the simulator; instance code 0) and its time is later
  than the node's: an agent without an instance id that restarts its sequence is known only by
  its clock moving on;
- it comes from neither of those two instances: a new sequence starts (a reinstall, a lost spool);
- the node's seq is not known (state restored from a snapshot written before seq was kept) and
  its time is later than the node's (its instance and seq are known from then on).
A new sample's instance becomes the current one, the current one the one before it.
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
    cur_seq: np.ndarray,
    old_instance: np.ndarray,
    old_seq: np.ndarray,
    last_ts: np.ndarray,
    keep: np.ndarray,
    event_ts: np.ndarray,
    jump: np.ndarray,
) -> None:
    """The rules of the module docstring, sample by sample in arrival order. `keep` arrives False,
    `event_ts` and `jump` NaN; state rows exist for every row in `rows` (last_ts NaN: no sample
    yet; cur_seq -1: not known)."""
    for i in range(len(rows)):
        r = rows[i]
        t = ts[i]
        bound = received[i] + lead_s  # NaN where the broker time is not known: no bound
        own = bound if t > bound else t
        known = last_ts[r]
        inst = instance[i]
        if math.isnan(known):
            new = True
        elif cur_seq[r] < 0:  # restored from before seq was kept: time alone, as then
            new = own > known
        elif inst == cur_instance[r]:
            new = seq[i] > cur_seq[r] or (inst == 0 and own > known)
        elif inst == old_instance[r]:
            new = seq[i] > old_seq[r] or (inst == 0 and own > known)
        else:  # a new sequence
            new = True
        if not new:
            continue
        keep[i] = True
        e = own if (math.isnan(known) or own > known) else known
        event_ts[i] = e
        jump[i] = t - e
        last_ts[r] = e
        if inst != cur_instance[r]:  # the current instance becomes the one before
            old_instance[r] = cur_instance[r]
            old_seq[r] = cur_seq[r]
        cur_instance[r] = inst
        cur_seq[r] = seq[i]


def warm_up() -> None:
    """Load the kernel from numba's cache, compiling it first if there is none (a few seconds)."""
    from fleetwatch.detectors.node_index import NodeIndex

    NodeIndex().admit(["n"], np.zeros(1))
