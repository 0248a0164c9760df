"""The conformance suite: checks that a CUDA-graph cache computes what its eager twin computes
and behaves under errors, threads, processes and memory pressure.

Run it against the bundled reference target, or your own (see pytest_cudagraph.target)::

    pytest --pyargs pytest_cudagraph.conformance
    pytest --pyargs pytest_cudagraph.conformance --cudagraph-target mypkg.graphs:make_target
"""
