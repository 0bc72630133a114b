"""`gpudoctor watch`: judge a running job from its processes and NVML samples (docs/watch.md).

samples.py holds the shapes (one node's observation: the job's processes and per-GPU NVML samples), judge.py the
pure rules over them, node.py the probe that runs on each node inside the job (no torch, no CUDA context), and
cli.py the command that resolves the job, runs the probes and reports. Importing this package imports nothing.
"""
