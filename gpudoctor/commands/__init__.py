"""The core's commands that gather and judge more than one machine: `check --job` (check_job.py) and
`compare` (compare.py). They sit above job/ (pure: what the job is) and use the runner, the probe and the
one output path (report/emit.py), which job/ may not (docs/architecture.md)."""
