"""The conformance suite: checks that CUDA-graph code computes what its eager twin computes and
behaves under errors, threads, processes and memory pressure.

This is the door: what a target author writes, and nothing else (the rooms behind it are
private). ``CudaGraphTarget``, its capabilities (``Cache``, ``State``, ``Sampling``, ...),
``Tolerance``, ``Case`` and the adapters (``compiled``, ``graphed_callables``, ``hand_written``).
Run the suite against the one installed target, one chosen by name, or yours::

    pytest --pyargs pytest_cudagraph.conformance
    pytest --pyargs pytest_cudagraph.conformance --cudagraph-target NAME
    pytest --pyargs pytest_cudagraph.conformance --cudagraph-target mypkg.graphs:make_target

Names resolve on first use: the suite's plugin imports this package in every pytest session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_cudagraph._lazy import lazy_door

if TYPE_CHECKING:
    from pytest_cudagraph.conformance._adapters import InductorSkips as InductorSkips
    from pytest_cudagraph.conformance._adapters import compiled as compiled
    from pytest_cudagraph.conformance._adapters import graphed_callables as graphed_callables
    from pytest_cudagraph.conformance._adapters import hand_written as hand_written
    from pytest_cudagraph.conformance._loading import TargetError as TargetError
    from pytest_cudagraph.conformance._loading import validate_target as validate_target
    from pytest_cudagraph.conformance._protocol import CONCURRENT as CONCURRENT
    from pytest_cudagraph.conformance._protocol import EXACT as EXACT
    from pytest_cudagraph.conformance._protocol import NEXT_CALL as NEXT_CALL
    from pytest_cudagraph.conformance._protocol import NEXT_CALL_OF_KEY as NEXT_CALL_OF_KEY
    from pytest_cudagraph.conformance._protocol import OWNED as OWNED
    from pytest_cudagraph.conformance._protocol import SERIAL as SERIAL
    from pytest_cudagraph.conformance._protocol import SINGLE as SINGLE
    from pytest_cudagraph.conformance._protocol import Cache as Cache
    from pytest_cudagraph.conformance._protocol import CaptureClean as CaptureClean
    from pytest_cudagraph.conformance._protocol import Case as Case
    from pytest_cudagraph.conformance._protocol import CudaGraphTarget as CudaGraphTarget
    from pytest_cudagraph.conformance._protocol import Fallbacks as Fallbacks
    from pytest_cudagraph.conformance._protocol import Guards as Guards
    from pytest_cudagraph.conformance._protocol import Inputs as Inputs
    from pytest_cudagraph.conformance._protocol import OutputLifetime as OutputLifetime
    from pytest_cudagraph.conformance._protocol import Padding as Padding
    from pytest_cudagraph.conformance._protocol import Sampling as Sampling
    from pytest_cudagraph.conformance._protocol import State as State
    from pytest_cudagraph.conformance._protocol import TargetOptions as TargetOptions
    from pytest_cudagraph.conformance._protocol import Threads as Threads
    from pytest_cudagraph.conformance._protocol import Tolerance as Tolerance
    from pytest_cudagraph.conformance._protocol import Trajectory as Trajectory
    from pytest_cudagraph.conformance._protocol import Workers as Workers
    from pytest_cudagraph.conformance._protocol import graphs_on as graphs_on

__getattr__, __dir__, __all__ = lazy_door(__name__, __file__, globals())
