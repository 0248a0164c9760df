"""The conformance suite: checks that a CUDA-graph cache computes what its eager twin computes
and behaves under errors, threads, processes and memory pressure.

Run it against the one installed target, one chosen by name, or your own (see
pytest_cudagraph.conformance.target and pytest_cudagraph.conformance.adapters)::

    pytest --pyargs pytest_cudagraph.conformance
    pytest --pyargs pytest_cudagraph.conformance --cudagraph-target NAME
    pytest --pyargs pytest_cudagraph.conformance --cudagraph-target mypkg.graphs:make_target
"""
