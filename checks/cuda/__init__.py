"""cuda checks: can torch be imported, is it a CUDA build that initialises, does it carry
kernels for these GPUs, and does it load the CUDA libraries it was built with.

One module per topic, discovered by gpudoctor.registry.load_all; a module whose name starts with _ holds
what the topics share and registers no check.
"""
