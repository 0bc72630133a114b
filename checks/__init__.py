"""Built-in checks, one module per category (installed as gpudoctor.checks).

Every module in this package is a check module: gpudoctor.registry.load_all discovers and imports
them (pkgutil), so a new checks/<category>.py is registered without being listed anywhere.
Importing this package alone registers nothing.
"""
