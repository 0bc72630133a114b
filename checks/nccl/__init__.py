"""nccl checks: NCCL in torch, and the NCCL_* / TORCH_NCCL_* variables read the way NCCL and torch read them.

How NCCL and torch read these variables: gpudoctor/readers/ncclenv.py (sources cited there).

One module per topic, discovered by gpudoctor.registry.load_all; a module whose name starts with _ holds
what the topics share and registers no check.
"""
