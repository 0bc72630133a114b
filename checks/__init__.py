"""Built-in checks, one module per category (installed as gpudoctor.checks).

Every module in this package and its sub-packages is a check module: gpudoctor.registry.load_all
discovers and imports them (pkgutil), so a new checks/<category>.py, or checks/<category>/<topic>.py in a
category grown into a package (checks/slurm/), is registered without being listed anywhere. A module whose
name starts with `_` holds helpers (checks/slurm/_shared.py) and is not imported as a check module.
Importing this package alone registers nothing.
"""
