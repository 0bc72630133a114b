"""Pure readers: each reads one input (a SLURM format, CUDA_VISIBLE_DEVICES, an allocator
setting, NCCL variables, a batch script, a training config) exactly as its real consumer does.

No I/O beyond the file a loader is asked to read, no knowledge of checks: a reader turns text
into a typed value or raises its own error with the reason.
"""
