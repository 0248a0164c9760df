"""The capture-clean decoder against upstream's forward, the encoder, input checks and seeded
construction (CPU)."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import Tensor
from torch.nn.modules import transformer

from reasyn_ref import Decoder, DecoderConfig, Encoder, EncoderConfig, expand_memory, model
from reasyn_ref.model import (
    LAYERS,
    cross_attention_inputs,
    seeded_decoder,
    seeded_encoder,
    skeleton,
    step_context,
    with_bf16_matmul_weights,
    with_weights,
)


def batch_inputs(
    decoder: Decoder, target: tuple[Tensor, Tensor], batch: int, length: int, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Random tokens [batch, length], the target's memory and mask over the batch, random gather."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, decoder.config.vocab_size, (batch, length), generator=generator)
    gather = torch.randint(0, length, (batch,), generator=generator)
    memory, mask = expand_memory(*target, batch)
    return tokens, memory, mask, gather


@pytest.fixture
def mask_spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """Records each ``_detect_is_causal_mask`` call's is_causal hint, each causal mask that
    ``_generate_square_subsequent_mask`` builds, and each ``torch.triu`` (how masks are built)."""
    seen: dict[str, list] = {"is_causal": [], "generated": [], "triu": []}
    detect = transformer._detect_is_causal_mask
    generate = transformer._generate_square_subsequent_mask
    triu = torch.triu

    def detect_spy(mask, is_causal=None, size=None):
        seen["is_causal"].append(is_causal)
        return detect(mask, is_causal, size)

    def generate_spy(*args, **kwargs):
        seen["generated"].append(args)
        return generate(*args, **kwargs)

    def triu_spy(*args, **kwargs):
        seen["triu"].append(args[0].shape)
        return triu(*args, **kwargs)

    monkeypatch.setattr(transformer, "_detect_is_causal_mask", detect_spy)
    monkeypatch.setattr(transformer, "_generate_square_subsequent_mask", generate_spy)
    monkeypatch.setattr(torch, "triu", triu_spy)
    return seen


@pytest.mark.parametrize("length", [1, 17, 64, 512])
def test_forward_skips_the_causal_mask_comparison(tiny_decoder, target, mask_spy, length):
    tokens, memory, mask, gather = batch_inputs(tiny_decoder, target, 3, length)
    with torch.no_grad():
        tiny_decoder(tokens, memory, mask, gather)
    # The hint reaches the detector, which returns it without building or comparing a mask.
    assert mask_spy == {"is_causal": [True], "generated": [], "triu": []}


def test_upstream_forward_runs_the_comparison(tiny_decoder, target, mask_spy):
    """The contrast: the same spy sees upstream's forward build and compare masks."""
    tokens, memory, mask, gather = batch_inputs(tiny_decoder, target, 3, 17)
    with torch.no_grad():
        tiny_decoder.forward_upstream(tokens, memory, mask, gather)
    assert mask_spy["is_causal"] == [None]
    assert len(mask_spy["generated"]) >= 2  # its own fresh mask, then the comparison's
    assert mask_spy["triu"]


@pytest.mark.parametrize("length", [1, 17, 64, 200, 512])
@pytest.mark.parametrize("with_gather", [False, True])
def test_forward_equals_upstream_exactly_in_fp32(tiny_decoder, target, length, with_gather):
    tokens, memory, mask, gather = batch_inputs(tiny_decoder, target, 3, length, seed=length)
    gather = gather if with_gather else None
    with torch.no_grad():
        ours = tiny_decoder(tokens, memory, mask, gather)
        upstream = tiny_decoder.forward_upstream(tokens, memory, mask, gather)
    assert ours.dtype == torch.float32
    assert ours.shape == (3, tiny_decoder.config.vocab_size)
    assert torch.equal(ours, upstream)


def test_causal_mask_is_a_non_persistent_buffer_built_once(tiny_decoder, target):
    assert "causal" in dict(tiny_decoder.named_buffers())
    assert "causal" not in tiny_decoder.state_dict()
    max_len = tiny_decoder.config.max_len
    assert tiny_decoder.causal.shape == (max_len, max_len)
    before = tiny_decoder.causal.data_ptr()
    for length in (5, 64, 512):
        tokens, memory, mask, gather = batch_inputs(tiny_decoder, target, 2, length)
        with torch.no_grad():
            tiny_decoder(tokens, memory, mask, gather)
    assert tiny_decoder.causal.data_ptr() == before


def test_default_gather_is_the_last_position(tiny_decoder, target):
    tokens, memory, mask, _ = batch_inputs(tiny_decoder, target, 4, 30)
    last = torch.full((4,), 29, dtype=torch.long)
    with torch.no_grad():
        assert torch.equal(
            tiny_decoder(tokens, memory, mask), tiny_decoder(tokens, memory, mask, last)
        )


def test_gather_reads_each_rows_position(tiny_decoder, target):
    """Row i's logits at gather[i] are those of its prefix tokens[i, :gather[i] + 1] alone:
    the causal mask keeps later (padding) positions out."""
    tokens, memory, mask, gather = batch_inputs(tiny_decoder, target, 4, 40, seed=3)
    with torch.no_grad():
        batched = tiny_decoder(tokens, memory, mask, gather)
        for row in range(4):
            prefix = tokens[row : row + 1, : int(gather[row]) + 1]
            alone = tiny_decoder(prefix, memory[:1], mask[:1])
            torch.testing.assert_close(batched[row : row + 1], alone, rtol=1e-5, atol=1e-5)


def test_encoder_memory_and_mask(tiny_encoder):
    config = tiny_encoder.config
    smiles = torch.tensor([[5, 6, 7, config.pad_token, config.pad_token]])
    with torch.no_grad():
        memory, mask = tiny_encoder(smiles)
    assert memory.shape == (1, 5, config.d_model)
    assert mask.tolist() == [[False, False, False, True, True]]
    assert torch.isfinite(memory).all()


def test_memory_is_expanded_over_the_batch_without_copying(target):
    memory, mask = target
    batch_memory, batch_mask = expand_memory(memory, mask, 8)
    assert batch_memory.shape == (8, *memory.shape[1:])
    assert batch_mask.shape == (8, mask.shape[1])
    assert batch_memory.data_ptr() == memory.data_ptr() and batch_memory.stride(0) == 0
    assert batch_mask.data_ptr() == mask.data_ptr() and batch_mask.stride(0) == 0


@pytest.mark.parametrize(
    ("name", "memory_shape", "mask_shape"),
    [
        ("memory", (2, 20, 32), (2, 20)),
        ("memory", (20, 32), (1, 20)),
        ("memory_padding_mask", (1, 20, 32), (1, 19)),
    ],
)
def test_expand_memory_refuses_bad_shapes(name, memory_shape, mask_shape):
    memory, mask = torch.zeros(memory_shape), torch.zeros(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        expand_memory(memory, mask, 4)


@pytest.mark.parametrize(
    ("batch", "error"), [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_expand_memory_refuses_a_batch_that_is_not_a_positive_int(target, batch, error):
    with pytest.raises(error, match=rf"^batch must be an int >= 1, got {batch!r}"):
        expand_memory(*target, batch)


def test_expand_memory_refuses_what_is_not_a_tensor(target):
    with pytest.raises(TypeError, match=r"^memory must be a floating-point tensor, got list"):
        expand_memory([[0.0]], target[1], 2)
    with pytest.raises(TypeError, match=r"^memory_padding_mask must be a torch.bool tensor, got"):
        expand_memory(target[0], target[1].tolist(), 2)
    with pytest.raises(ValueError, match=r"^memory_padding_mask must be a torch.bool tensor, got"):
        expand_memory(target[0], target[1].float(), 2)


def bad(name: str, case: str, change) -> pytest.ParameterSet:
    """A forward-input case: ``change`` maps the valid inputs to bad ones; ``name`` is the
    argument the error must name."""
    return pytest.param(name, change, id=case)


BAD_FORWARD_INPUTS = [
    bad("tokens", "float tokens", lambda x: x | {"tokens": x["tokens"].float()}),
    bad("tokens", "1-d tokens", lambda x: x | {"tokens": x["tokens"][0]}),
    bad(
        "tokens",
        "id = vocab",
        lambda x: x | {"tokens": x["tokens"].index_fill(1, torch.tensor([0]), 272)},
    ),
    bad(
        "tokens",
        "negative id",
        lambda x: x | {"tokens": x["tokens"].index_fill(1, torch.tensor([0]), -1)},
    ),
    bad(
        "tokens",
        "length over max_len",
        lambda x: x | {"tokens": torch.zeros(3, 513, dtype=torch.long)},
    ),
    bad("gather", "gather = L", lambda x: x | {"gather": torch.full((3,), 10)}),
    bad("gather", "negative gather", lambda x: x | {"gather": torch.full((3,), -1)}),
    bad("gather", "int32 gather", lambda x: x | {"gather": x["gather"].int()}),
    bad("gather", "gather batch mismatch", lambda x: x | {"gather": x["gather"][:2]}),
    bad(
        "memory",
        "memory batch mismatch",
        lambda x: (
            x | {"memory": x["memory"][:2], "memory_padding_mask": x["memory_padding_mask"][:2]}
        ),
    ),
    bad("memory", "memory width mismatch", lambda x: x | {"memory": torch.zeros(3, 20, 16)}),
    bad("memory", "integer memory", lambda x: x | {"memory": x["memory"].long()}),
    bad("memory", "float64 memory", lambda x: x | {"memory": x["memory"].double()}),
    bad("memory", "bf16 memory", lambda x: x | {"memory": x["memory"].bfloat16()}),
    bad(
        "memory",
        "memory length 0",
        lambda x: (
            x
            | {"memory": x["memory"][:, :0], "memory_padding_mask": x["memory_padding_mask"][:, :0]}
        ),
    ),
    bad(
        "memory_padding_mask",
        "mask shape mismatch",
        lambda x: x | {"memory_padding_mask": x["memory_padding_mask"][:, :19]},
    ),
    bad(
        "memory_padding_mask",
        "float mask",
        lambda x: x | {"memory_padding_mask": x["memory_padding_mask"].float()},
    ),
]


@pytest.mark.parametrize(("name", "change"), BAD_FORWARD_INPUTS)
def test_forward_refuses_bad_input_naming_it(tiny_decoder, target, name, change):
    tokens, memory, mask, gather = batch_inputs(tiny_decoder, target, 3, 10)
    valid = {"tokens": tokens, "memory": memory, "memory_padding_mask": mask, "gather": gather}
    with pytest.raises(ValueError, match=rf"^{name}\b"), torch.no_grad():
        tiny_decoder(**change(valid))


@pytest.mark.parametrize(
    ("smiles", "error"),
    [
        (torch.ones(1, 5), ValueError),  # float
        (torch.tensor([[1, 2, 200]]), ValueError),  # id = vocab
        (torch.tensor([[1, -2, 3]]), ValueError),  # negative id
        (torch.ones(1, 257, dtype=torch.long), ValueError),  # longer than max_len 256
        (torch.ones(5, dtype=torch.long), ValueError),  # not [targets, length]
        (torch.ones(0, 5, dtype=torch.long), ValueError),  # no target
        ([[1, 2, 3]], TypeError),  # a list
    ],
)
def test_encoder_refuses_bad_smiles(tiny_encoder: Encoder, smiles, error):
    with pytest.raises(error, match=r"^smiles\b"):
        tiny_encoder(smiles)


def test_encoder_refuses_a_row_of_only_padding_naming_it(tiny_encoder: Encoder):
    pad = tiny_encoder.config.pad_token
    smiles = torch.tensor([[5, 6, pad], [pad, pad, pad], [7, pad, pad]])
    with pytest.raises(ValueError, match=rf"^smiles row 1 holds only pad tokens \({pad}\)"):
        tiny_encoder(smiles)


# --- seeded construction -------------------------------------------------------------------


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return model.state_dict()


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return state(a).keys() == state(b).keys() and all(
        torch.equal(state(a)[name], state(b)[name]) for name in state(a)
    )


def test_a_seed_gives_the_same_weights_and_another_seed_others():
    config = DecoderConfig.tiny()
    assert same_weights(seeded_decoder(config, 3), seeded_decoder(config, 3))
    assert not same_weights(seeded_decoder(config, 3), seeded_decoder(config, 4))


def test_weights_drawn_where_the_model_goes_are_seeded_too():
    config = DecoderConfig.tiny()
    # On the CPU, drawing "on the device" is drawing on the CPU: the portable weights.
    assert same_weights(seeded_decoder(config, 3, portable=False), seeded_decoder(config, 3))
    with pytest.raises(TypeError, match="portable must be a bool, got 'no'"):
        seeded_decoder(config, 3, portable="no")


def test_seeded_models_neither_read_nor_change_the_global_rng():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = seeded_decoder(DecoderConfig.tiny(), 5)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(999)  # another global state: the same weights
    assert same_weights(first, seeded_decoder(DecoderConfig.tiny(), 5))
    seeded_encoder(EncoderConfig.tiny(), 5)
    assert torch.equal(torch.get_rng_state(), torch.manual_seed(999).get_state())


@pytest.mark.slow
def test_building_a_seeded_model_does_not_import_dynamo():
    """torch._dynamo takes seconds to import; a model built on the meta device imported it
    (meta ops run as Python references), and every conformance run and worker paid for it."""
    script = (
        "import sys\n"
        "from reasyn_ref import DecoderConfig, EncoderConfig\n"
        "from reasyn_ref.model import seeded_decoder, seeded_encoder\n"
        "seeded_decoder(DecoderConfig.tiny(), 0)\n"
        "seeded_encoder(EncoderConfig.tiny(), 0)\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_seeded_decoders_built_in_threads_equal_those_built_alone():
    config = DecoderConfig.tiny()
    seeds = list(range(8))
    alone = [seeded_decoder(config, seed) for seed in seeds]
    barrier = threading.Barrier(len(seeds))

    def build(seed: int) -> Decoder:
        barrier.wait()  # all threads build at once
        return seeded_decoder(config, seed)

    with ThreadPoolExecutor(len(seeds)) as pool:
        threaded = list(pool.map(build, seeds))
    assert all(same_weights(a, t) for a, t in zip(alone, threaded, strict=True))


def test_seeded_weights_have_the_default_inits_scale():
    decoder = seeded_decoder(DecoderConfig.tiny(), 0)
    fresh = Decoder(DecoderConfig.tiny())
    for name, param in decoder.named_parameters():
        reference = dict(fresh.named_parameters())[name]
        assert param.abs().max() <= reference.abs().max() * 1.5 + 1e-6, name
        assert torch.isfinite(param).all(), name
    assert torch.equal(decoder.causal, fresh.causal) and torch.equal(
        decoder.positions, fresh.positions
    )
    assert not decoder.training


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (1.0, TypeError), (True, TypeError)])
def test_a_seed_must_be_a_non_negative_int(seed, error):
    with pytest.raises(error, match=rf"^seed must be an int >= 0, got {seed!r}"):
        seeded_decoder(DecoderConfig.tiny(), seed)


def test_bf16_matmul_weights_give_bit_identical_results_under_autocast(tiny_decoder):
    """The graph cache runs this copy: casting the matmul weights once must give exactly what
    autocast gives by casting them on every call."""
    copy = with_bf16_matmul_weights(tiny_decoder)
    matmul_dtypes = {
        p.dtype for n, p in copy.named_parameters() if "norm" not in n and "embed" not in n
    }
    assert matmul_dtypes == {torch.bfloat16}
    assert {p.dtype for n, p in copy.named_parameters() if "norm" in n} == {torch.float32}
    assert all(p.dtype == torch.float32 for p in tiny_decoder.parameters())  # original untouched
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(3, 272, (4, 70), generator=generator)
    memory = torch.randn(4, 64, tiny_decoder.config.d_model, generator=generator)
    mask = torch.zeros(4, 64, dtype=torch.bool)
    mask[:, 50:] = True
    gather = torch.tensor([69, 3, 10, 40])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        expected = tiny_decoder(tokens, memory, mask, gather)
        assert torch.equal(copy(tokens, memory, mask, gather), expected)


@pytest.fixture
def cudnn_attention_enabled():
    """cuDNN attention on, as torch starts; whatever the test leaves, put back afterwards."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_a_cuda_step_turns_cudnn_attention_off_and_back(cudnn_attention_enabled):
    """Only the flag is touched (no CUDA call), so this runs without a GPU."""
    with step_context(torch.device("cuda", 0), bf16=False):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with step_context(torch.device("cpu"), bf16=True):
        assert torch.backends.cuda.cudnn_sdp_enabled()  # CPU steps leave CUDA settings alone


def test_a_failing_step_still_restores_cudnn_attention(cudnn_attention_enabled):
    with pytest.raises(RuntimeError, match="boom"), step_context(torch.device("cuda"), False):
        raise RuntimeError("boom")
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_a_caller_who_had_cudnn_attention_off_keeps_it_off(cudnn_attention_enabled):
    torch.backends.cuda.enable_cudnn_sdp(False)
    with step_context(torch.device("cuda", 0), bf16=False):
        pass
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_overlapping_steps_in_threads_restore_cudnn_attention_after_the_last(
    cudnn_attention_enabled,
):
    """Thread A enters, B enters, A leaves while B still runs: the flag must stay off for B and
    come back on only when B leaves (a plain save-and-restore would turn it on under B)."""
    a_entered, b_entered, a_left = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}
    cuda = torch.device("cuda", 0)

    def step_a() -> None:
        with step_context(cuda, bf16=False):
            a_entered.set()
            b_entered.wait(5)
        a_left.set()

    def step_b() -> None:
        a_entered.wait(5)
        with step_context(cuda, bf16=False):
            b_entered.set()
            a_left.wait(5)
            seen["under B after A left"] = torch.backends.cuda.cudnn_sdp_enabled()

    threads = [threading.Thread(target=step_a), threading.Thread(target=step_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert a_left.is_set() and seen == {"under B after A left": False}
    assert torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.parametrize("shared_memory", [True, False], ids=["expanded memory", "per-row memory"])
def test_under_autocast_the_forward_converts_memory_once_and_still_equals_upstream(
    tiny_decoder, shared_memory, monkeypatch
):
    """Under autocast the forward hands the layers memory and mask already converted, as each
    layer would convert them; upstream's forward converts them in every layer. Same bits."""
    generator = torch.Generator().manual_seed(7)
    batch, d_model = 4, tiny_decoder.config.d_model
    tokens = torch.randint(3, 272, (batch, 70), generator=generator)
    if shared_memory:
        memory = torch.randn(1, 64, d_model, generator=generator).expand(batch, -1, -1)
    else:
        memory = torch.randn(batch, 64, d_model, generator=generator)
    mask = torch.zeros(batch, 64, dtype=torch.bool)
    mask[:, 50:] = True
    gather = torch.tensor([69, 3, 10, 40])
    converted = []

    def spy(*args):
        converted.append(cross_attention_inputs(*args))
        return converted[-1]

    monkeypatch.setattr(model, "cross_attention_inputs", spy)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        expected = tiny_decoder.forward_upstream(tokens, memory, mask, gather)
        assert not converted
        assert torch.equal(tiny_decoder(tokens, memory, mask, gather), expected)
    [(cast_memory, per_head_mask)] = converted
    nhead = tiny_decoder.config.nhead
    assert cast_memory.dtype == per_head_mask.dtype == torch.bfloat16
    assert per_head_mask.shape == (batch * nhead, 70, 64)
    padded = mask.repeat_interleave(nhead, dim=0).unsqueeze(1).expand(-1, 70, -1)
    assert torch.equal(per_head_mask.isinf(), padded) and not per_head_mask[~padded].any()


def test_a_model_needs_a_config_of_its_kind_and_the_bf16_copy_a_decoder():
    with pytest.raises(TypeError, match=r"^config must be a DecoderConfig, got EncoderConfig"):
        Decoder(EncoderConfig.tiny())
    with pytest.raises(TypeError, match=r"^config must be an EncoderConfig, got dict"):
        Encoder(EncoderConfig.tiny().to_dict())
    with pytest.raises(TypeError, match=r"^decoder must be a reasyn_ref Decoder, got Linear"):
        with_bf16_matmul_weights(torch.nn.Linear(2, 2))


def test_a_skeleton_has_every_weight_of_one_layer_and_holds_no_memory():
    for config in (DecoderConfig.tiny(), EncoderConfig.tiny()):
        model = (Decoder if isinstance(config, DecoderConfig) else Encoder)(config)
        one_layer = skeleton(config)
        shapes = {name: t.shape for name, t in one_layer.state_dict().items()}
        built = {
            name: t.shape
            for name, t in model.state_dict().items()
            if not name.startswith(f"{LAYERS}1.")
        }
        assert shapes == built
        assert all(t.is_meta for t in one_layer.state_dict().values())
        assert one_layer.positions.is_meta and one_layer.positions.shape == model.positions.shape


@pytest.mark.parametrize(
    "config", [DecoderConfig.tiny(), EncoderConfig.tiny()], ids=lambda c: type(c).__name__
)
def test_a_model_with_weights_holds_them_draws_nothing_and_computes_its_buffers(config):
    built = Decoder(config) if isinstance(config, DecoderConfig) else Encoder(config)
    weights = {name: t.detach().clone() for name, t in built.state_dict().items()}
    rng_before = torch.random.get_rng_state()
    held = with_weights(lambda: type(built)(config), weights)
    assert torch.equal(torch.random.get_rng_state(), rng_before), "an init drew from the RNG"
    assert not held.training
    state = held.state_dict()
    assert all(state[name].data_ptr() == weight.data_ptr() for name, weight in weights.items())
    assert state.keys() == weights.keys()
    buffers = dict(held.named_buffers())
    assert buffers.keys() == dict(built.named_buffers()).keys()
    assert all(torch.equal(buffers[name], b) for name, b in built.named_buffers())


def test_a_model_with_weights_missing_one_is_refused_by_torch():
    weights = Decoder(DecoderConfig.tiny()).state_dict()
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict"):
        with_weights(lambda: Decoder(DecoderConfig.tiny()), dict(list(weights.items())[1:]))
