"""The user's side of the bucket-runner example, nano-vllm style: a small decode model, and a
runner that captures one CUDA graph per batch bucket at start-up, largest first, all in one
shared memory pool, then pads each real batch up to its bucket. Every graph writes one static
output buffer: an output is valid until the next call."""

from __future__ import annotations

import torch
from torch import Tensor, nn

VOCAB, DIM, MAX_POSITION = 128, 64, 256
BUCKETS = (1, 2, 4, 8, 16)


class DecodeModel(nn.Module):
    """One decode step of a batch: each row's token at its position -> the next token's logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.embed_positions = nn.Embedding(MAX_POSITION, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.SiLU(), nn.Linear(4 * DIM, DIM))
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        hidden = self.embed_tokens(input_ids) + self.embed_positions(positions)
        return self.lm_head(hidden + self.mlp(hidden))


def make_model(device: torch.device) -> DecodeModel:
    torch.manual_seed(0)
    return DecodeModel().to(device).eval().requires_grad_(False)


class BucketRunner:
    """``run(input_ids, positions)``: the model on a batch of up to 16 rows through the graph of
    its bucket (larger batches run eagerly)."""

    def __init__(self, model: DecodeModel, device: torch.device) -> None:
        self.model = model
        largest = BUCKETS[-1]
        self.graph_vars = {
            "input_ids": torch.zeros(largest, dtype=torch.long, device=device),
            "positions": torch.zeros(largest, dtype=torch.long, device=device),
            "outputs": torch.zeros(largest, VOCAB, device=device),
        }
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.capture_cudagraph()

    @torch.inference_mode()
    def capture_cudagraph(self) -> None:
        graph_vars, pool = self.graph_vars, None
        for bs in reversed(BUCKETS):  # largest first: the smaller graphs reuse its pool
            graph = torch.cuda.CUDAGraph()
            input_ids, positions = graph_vars["input_ids"][:bs], graph_vars["positions"][:bs]
            graph_vars["outputs"][:bs] = self.model(input_ids, positions)  # warm up
            with torch.cuda.graph(graph, pool):
                graph_vars["outputs"][:bs] = self.model(input_ids, positions)  # capture
            if pool is None:
                pool = graph.pool()
            self.graphs[bs] = graph
            torch.cuda.synchronize()

    @torch.inference_mode()
    def run(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        bs = input_ids.size(0)
        if bs > BUCKETS[-1]:
            return self.model(input_ids, positions)
        graph = self.graphs[next(bucket for bucket in BUCKETS if bucket >= bs)]
        graph_vars = self.graph_vars
        graph_vars["input_ids"][:bs] = input_ids
        graph_vars["positions"][:bs] = positions
        graph.replay()
        return graph_vars["outputs"][:bs]
