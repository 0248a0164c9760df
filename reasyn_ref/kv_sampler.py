"""Batched AR sampling with the KV decoder: ``ARSampler``'s interface, one token of work a step.

Per target, the prefixes are prefilled once (eagerly) into a KV cache of ``bucket_seq(max_len)``
positions for ``bucket_batch(rows)`` rows, then every step feeds each row's last token at its
position. A finished row keeps feeding its last token at its last position (its logits are
ignored) and dummy rows feed the start token at position 0, so a row's slot never moves and the
batch keeps its bucket. With ``cudagraph`` the step replays a graph of the batch bucket
(``StepGraphCache``), without it runs eagerly on buffers of the same shapes (``EagerSteps``);
both on the same bf16-weight copy of the decoder, so graphs on and off sample the same tokens.

Per step: one host-to-device copy (tokens and positions together, pinned on CUDA), one draw
over all real rows, one device-to-host copy of the tokens. That draw differs from
``ARSampler``'s, so the two samplers' tokens are not expected to match; their logits agree
within floating-point tolerance (docs/kv.md)."""

from __future__ import annotations

import torch

from .bucketing import bucket_seq
from .checks import check_bool
from .kv_decoder import EagerSteps, KVDecoder, StepBuffers, StepKey, StepSource, claimed
from .model import Decoder, step_context, with_bf16_matmul_weights
from .sampler import SampleCall, TargetSampler, check_graph_settings, pad_memory, pad_rows


class KVSampler(TargetSampler):
    """Samples continuations of token prefixes with a ``Decoder``'s weights and a KV cache.

    Flags left as None come from ``REASYN_BF16`` and ``REASYN_CUDAGRAPH``; explicit arguments
    win. Always batched and bucketed (the cache is per batch bucket). The decoder's weights are
    read when the sampler is built (with bf16 on CUDA, copied): build a new sampler after
    changing them. ``temperature``: see ``TargetSampler``. ``compile_blocks``: the steps run
    ``KVDecoder``'s compiled blocks, graphs on and off alike (one compilation per batch bucket).
    """

    steps: StepSource

    def __init__(
        self,
        decoder: Decoder,
        *,
        temperature: float = 0.1,
        bf16: bool | None = None,
        cudagraph: bool | None = None,
        graph_capacity: int = 3,
        compile_blocks: bool = False,
    ) -> None:
        self.compile_blocks = check_bool("compile_blocks", compile_blocks)
        super().__init__(
            decoder,
            temperature=temperature,
            bf16=bf16,
            cudagraph=cudagraph,
            graph_capacity=graph_capacity,
        )

    def _build_steps(self) -> None:
        if self.cudagraph:
            check_graph_settings(batched=True, bucket=True, bf16=self.bf16, device=self.device)
        on_gpu_in_bf16 = self.bf16 and self.device.type == "cuda"
        decoder = with_bf16_matmul_weights(self.decoder) if on_gpu_in_bf16 else self.decoder
        self.kv = KVDecoder(decoder, compile_blocks=self.compile_blocks)
        if self.cudagraph:
            from .kv_graphs import StepGraphCache  # only graph runs need it

            self.steps = StepGraphCache(self.kv, capacity=self.graph_capacity)
        else:
            self.steps = EagerSteps(self.kv, bf16=self.bf16)

    def _decode(self, call: SampleCall) -> list[list[int]]:
        """Prefill the prefixes once, then one step per token, every row in its slot."""
        sequences, generator, max_len = call.sequences, call.generator, call.max_len
        if all(self._finished(seq, max_len) for seq in sequences):
            return sequences
        memory, memory_padding_mask = pad_memory(call.memory, call.memory_padding_mask)
        rows = len(sequences)
        tokens, gather = pad_rows(
            sequences, self.config, bucket=True, pin_memory=self.device.type == "cuda"
        )
        key = StepKey(tokens.shape[0], bucket_seq(max_len, self.config.max_len), memory.shape[1])
        with self.steps.claim(key) as slot:
            buffers = claimed(slot)
            with step_context(self.device, self.bf16):
                self.kv.load_target(buffers, memory, memory_padding_mask)
                logits = self.kv.prefill(buffers, *self.stage_inputs(tokens, gather))
            logits = logits[:rows].to(torch.float32, copy=True)
            active = [not self._finished(seq, max_len) for seq in sequences]
            while True:
                for i, token in enumerate(self._draw(logits, generator)):
                    if active[i]:
                        sequences[i].append(token)
                        active[i] = not self._finished(sequences[i], max_len)
                if not any(active):
                    return sequences
                self._stage_step(buffers, sequences)
                logits = slot.step(rows)

    def _stage_step(self, buffers: StepBuffers, sequences: list[list[int]]) -> None:
        """A step's one host-to-device copy: each row's last token and its position; dummy rows
        the start token at 0."""
        dummies = buffers.key.batch - len(sequences)
        tokens = [seq[-1] for seq in sequences] + [self.config.start_token] * dummies
        positions = [len(seq) - 1 for seq in sequences] + [0] * dummies
        host = torch.tensor(
            [tokens, positions], dtype=torch.long, pin_memory=self.device.type == "cuda"
        )
        buffers.inputs.copy_(host, non_blocking=True)
