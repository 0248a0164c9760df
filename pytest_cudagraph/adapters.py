"""Deprecated alias of ``pytest_cudagraph.conformance.adapters``, where this module moved in
0.3.0; the alias goes in 0.5.0. Importing it gives the moved module itself, so every name is the
same object under both paths."""

import sys

from pytest_cudagraph.conformance import adapters as _moved
from pytest_cudagraph.conformance.legacy import REMOVED_IN, warn_at_user

warn_at_user(
    "pytest_cudagraph.adapters moved to pytest_cudagraph.conformance.adapters in 0.3.0; the old "
    f"name goes in {REMOVED_IN}"
)
sys.modules[__name__] = _moved
