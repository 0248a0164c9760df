"""The user's side of the piecewise example: a small stack of layers whose attention runs
eagerly between CUDA graphs of their MLPs, as breakable or piecewise CUDA-graph code (vLLM's
piecewise mode) runs a model where attention cannot be captured: one graph per layer for each
input shape, captured on that shape's first call, so a key holds several graphs."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn

D_MODEL, LAYERS = 64, 3


class Layer(nn.Module):
    """Attention (left eager) and an MLP (graphed), each added to the hidden states."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU())
        self.out = nn.Linear(4 * D_MODEL, D_MODEL)

    def attend(self, hidden: Tensor) -> Tensor:
        scores = hidden @ hidden.transpose(-1, -2) / math.sqrt(D_MODEL)
        return torch.softmax(scores, dim=-1) @ hidden

    def feed_forward(self, normed: Tensor) -> Tensor:
        return self.out(self.mlp(normed))

    def forward(self, hidden: Tensor) -> Tensor:
        hidden = hidden + self.attend(hidden)
        return hidden + self.feed_forward(self.norm(hidden))


def make_layers(device: torch.device) -> nn.ModuleList:
    torch.manual_seed(0)
    layers = nn.ModuleList(Layer() for _ in range(LAYERS))
    return layers.to(device).eval().requires_grad_(False)


@torch.inference_mode()
def run_eagerly(layers: nn.ModuleList, hidden: Tensor) -> Tensor:
    """The layers without graphs: the eager twin of ``PiecewiseRunner.run``."""
    for layer in layers:
        hidden = layer(hidden)
    return hidden


@dataclasses.dataclass
class Piece:
    """One layer's graphed segment: the static input it reads, its graph, the output it writes."""

    input: Tensor
    graph: torch.cuda.CUDAGraph
    output: Tensor


class PiecewiseRunner:
    """``run(hidden)``: every layer, its attention eagerly and its feed-forward through the CUDA
    graph of the input's shape for that layer (captured on the shape's first call)."""

    def __init__(self, layers: nn.ModuleList, device: torch.device) -> None:
        self.layers, self.device = layers, device
        self.pieces: dict[torch.Size, list[Piece]] = {}

    @torch.inference_mode()
    def run(self, hidden: Tensor) -> Tensor:
        pieces = self.pieces.get(hidden.shape) or self.capture(hidden)
        for layer, piece in zip(self.layers, pieces, strict=True):
            hidden = hidden + layer.attend(hidden)
            piece.input.copy_(layer.norm(hidden))
            piece.graph.replay()
            hidden = hidden + piece.output
        return hidden

    def capture(self, hidden: Tensor) -> list[Piece]:
        pieces = []
        for layer in self.layers:
            static = torch.zeros_like(hidden)
            layer.feed_forward(static)  # warm up
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                output = layer.feed_forward(static)
            pieces.append(Piece(static, graph, output))
        self.pieces[hidden.shape] = pieces
        return pieces
