"""The one skip for a missing GPU: its reason, and the mark the conformance checks and the
project's GPU tests carry. Importing this module imports torch (the plugin imports it only in
the fixtures that need CUDA)."""

import pytest
import torch

NEEDS_CUDA = "needs CUDA: torch.cuda.is_available() is False"

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_CUDA)
