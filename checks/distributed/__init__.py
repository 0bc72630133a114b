"""distributed checks: the launcher's rank variables, the rendezvous endpoint, deprecated names.

One module per topic, discovered by gpudoctor.registry.load_all; a module whose name starts with _ holds
what the topics share and registers no check.
"""
