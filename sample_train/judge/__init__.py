"""The smoke run's judgement: pure functions from the ranks' measurements to the report and its findings.

Nothing here imports torch or touches the machine (tests/core/test_import_graph.py holds it); the torch side
(launch, worker, bench, model, data, selftest) is the package above.
"""
