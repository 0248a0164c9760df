"""pytest plugin and conformance checks for PyTorch code accelerated with CUDA graphs."""

__version__ = "0.1.0"
