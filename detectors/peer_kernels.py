"""The compiled inner loop of detectors.statistical.sibling_robust_z: each row's sibling GPUs
against their own median and MAD, one small group at a time.

A batch holds ~1,000 rows x 3 signals of 8 GPUs each. numpy did it with two sorts along the short
axis and a dozen whole-array temporaries (~0.9 us a message of the worker's CPU); this loop
sorts each group of at most a few values in place (insertion sort) and writes the z scores
directly. The same numbers: tests/test_statistical.py checks it against fleet_robust_z, gaps and
ties included.

Compiled once, cached by numba beside this file (warm_up()); releases the GIL.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution is 0.6745 sigma


@njit(cache=True, inline="always")
def _sort_prefix(a: np.ndarray, n: int) -> None:
    for i in range(1, n):
        v = a[i]
        j = i - 1
        while j >= 0 and a[j] > v:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = v


# error_model="numpy": a zero scale with a nonzero deviation gives +-inf, as numpy does, not an error
@njit(cache=True, nogil=True, error_model="numpy")
def sibling_z_pass(x: np.ndarray, floor: np.ndarray, min_peers: int, out: np.ndarray) -> None:
    """x (M, G, S): out[m, g, s] = (x - median) / max(MAD_TO_SIGMA * MAD, floor) over the present
    values of x[m, :, s]; 0 where the value is the median, NaN where it is absent or fewer than
    min_peers are present."""
    m_rows, g_n, s_n = x.shape
    vals = np.empty(g_n)
    devs = np.empty(g_n)
    for m in range(m_rows):
        for s in range(s_n):
            n = 0
            for g in range(g_n):
                v = x[m, g, s]
                if not math.isnan(v):
                    vals[n] = v
                    n += 1
            if n == 0 or n < min_peers:
                for g in range(g_n):
                    out[m, g, s] = np.nan
                continue
            _sort_prefix(vals, n)
            med = 0.5 * (vals[(n - 1) // 2] + vals[n // 2])
            for k in range(n):
                devs[k] = abs(vals[k] - med)
            _sort_prefix(devs, n)
            spread = MAD_TO_SIGMA * (0.5 * (devs[(n - 1) // 2] + devs[n // 2]))
            for g in range(g_n):
                v = x[m, g, s]
                if math.isnan(v):
                    out[m, g, s] = np.nan
                    continue
                f = floor[m, g, s]
                scale = spread if spread > f else f  # a NaN floor gives NaN, as np.maximum does
                out[m, g, s] = (v - med) / scale if abs(v - med) > 0 else 0.0


def warm_up() -> None:
    """Load the kernel from numba's cache, compiling it first if there is none (~5 s)."""
    x = np.ones((1, 1, 1))
    sibling_z_pass(x, np.broadcast_to(np.zeros(1), x.shape), 1, np.empty_like(x))
