"""`fleetwatch slurm-jobs`: the scheduler's job starts and ends as job/1 (controller side)."""
