"""The one skip for a missing GPU, its reason, and the ``cuda`` marker that tells the tests
needing a GPU apart (the GPU recipe selects them with ``-m cuda``): ``needs_cuda`` carries both,
so that a test skipping for want of CUDA is always one the recipe runs (the plugin registers the
marker: the conformance checks carry it wherever they run). Importing this module imports torch
(the plugin imports it only in the fixtures that need CUDA)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

NEEDS_CUDA = "needs CUDA: torch.cuda.is_available() is False"
Marked = TypeVar("Marked", bound=Callable[..., object] | type)


class Marks(list[pytest.MarkDecorator]):
    """Marks that go together: a decorator applying each (``@needs_cuda``), and a list a
    module's ``pytestmark`` may be (``pytestmark = needs_cuda``, or ``[*needs_cuda, ...]``)."""

    def __call__(self, obj: Marked) -> Marked:
        for mark in self:
            obj = mark(obj)
        return obj


needs_cuda = Marks(
    [
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_CUDA),
    ]
)
