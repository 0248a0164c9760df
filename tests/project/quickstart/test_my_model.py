import pytest
import torch


@pytest.fixture
def model(cuda_device):
    return torch.nn.Linear(64, 64).to(cuda_device)


@pytest.mark.no_host_sync(trial_capture=True)  # a forward that syncs cannot be graphed
def test_forward_is_capture_clean(model, cuda_device):
    model(torch.randn(8, 64, device=cuda_device))
