"""Deprecated alias of ``pytest_cudagraph.conformance.target``, where this module moved in 0.3.0
(itself deprecated since: the protocol is in ``pytest_cudagraph.conformance``); the alias goes
in 0.5.0. Importing it gives that module itself, so every name is the same object under both."""

import sys

from pytest_cudagraph.conformance import target as _moved
from pytest_cudagraph.conformance.legacy import REMOVED_IN, warn_at_user

if __name__ == "__main__":
    print("\n".join(_moved.installed_lines()))
else:
    warn_at_user(
        "pytest_cudagraph.target moved to pytest_cudagraph.conformance in 0.3.0; the old "
        f"name goes in {REMOVED_IN}"
    )
    sys.modules[__name__] = _moved
