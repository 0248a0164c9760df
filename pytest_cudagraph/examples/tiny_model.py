"""The user's side of the compiled and graphed-callables examples: a small MLP."""

import torch
from torch import nn


def make_model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    return model.eval().requires_grad_(False).to(device)
