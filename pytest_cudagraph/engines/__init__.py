"""The engines: what the checks measure and compare, free of pytest's hooks.

Each module is usable on its own (``from pytest_cudagraph.engines.parity import
ParityChecker``) and imports torch and NVML only inside the functions that need them, so
importing an engine costs nothing. Nothing here imports the pytest layer or the conformance
wing; they build on these.
"""
