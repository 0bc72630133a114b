"""hardware checks: memory errors, throttling, PCIe and NVLink links, the NVSwitch fabric.

One module per topic, discovered by gpudoctor.registry.load_all; a module whose name starts with _ holds
what the topics share and registers no check.
"""
