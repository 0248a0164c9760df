"""Deprecated alias of ``pytest_cudagraph.conformance.target``, where this module moved in 0.3.0;
the alias goes in 0.4.0. Importing it gives the moved module itself, so every name is the same
object under both paths."""

import sys
import warnings

from pytest_cudagraph.conformance import target as _moved

if __name__ == "__main__":
    _moved.main()
else:
    warnings.warn(
        "pytest_cudagraph.target moved to pytest_cudagraph.conformance.target; the old name goes in 0.4.0",
        DeprecationWarning,
        stacklevel=2,
    )
    sys.modules[__name__] = _moved
