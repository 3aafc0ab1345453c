"""One rank of a stand-in training job, run by `srun` on every node of a real sbatch job
(tests/integration/test_slurm_e2e.py): each step sleeps the step time, and the rank on SLOW_NODE
sleeps longer. It reports its steps as a training loop would, with fleetwatch.steps in three
lines; the broker comes from $FLEETWATCH_BOOTSTRAP and the job, rank and node from Slurm's
environment.

    python3 train_steps.py STEPS STEP_S SLOW_NODE SLOW_FACTOR
"""

from __future__ import annotations

import os
import sys
import time

from fleetwatch.steps import StepReporter


def main() -> int:
    steps, step_s, slow_node, factor = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    sleep_s = step_s * (factor if os.environ.get("SLURMD_NODENAME") == slow_node else 1.0)
    with StepReporter() as steps_out:
        for step in range(steps):
            time.sleep(sleep_s)  # the forward and backward pass
            steps_out.step(step)  # step time measured between calls
    return 0


if __name__ == "__main__":
    sys.exit(main())
