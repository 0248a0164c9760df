"""Checkpoints: round trips, and the files load_checkpoint must refuse, before building anything
from them: code, damaged or cut archives, configs that ask for more than the file holds, and
weights of the wrong name, shape, dtype, layout or values."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from reasyn_ref import (
    Decoder,
    DecoderConfig,
    Encoder,
    checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from reasyn_ref.checkpoint import FORMAT_VERSION, WEIGHT_DTYPES
from reasyn_ref.config import MAX_LEN


class RunsCode:
    """Pickles as a call to exec that creates ``marker``: what a hostile checkpoint carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


@pytest.fixture
def saved(tmp_path, tiny_decoder) -> Path:
    path = tmp_path / "decoder.pt"
    save_checkpoint(path, tiny_decoder, tiny_decoder.config)
    return path


def rewrite(path: Path, change) -> Path:
    """Save ``change(payload)`` of the checkpoint at ``path`` as a new file beside it."""
    payload = torch.load(path, weights_only=True)
    out = path.with_name("changed.pt")
    torch.save(change(payload), out)
    return out


def test_decoder_round_trip(saved, tiny_decoder, target):
    loaded = load_checkpoint(saved)
    assert isinstance(loaded, Decoder)
    assert loaded.config == tiny_decoder.config
    assert not loaded.training
    assert all(p.device.type == "cpu" for p in loaded.parameters())
    tokens = torch.randint(0, 272, (2, 9), generator=torch.Generator().manual_seed(0))
    memory, mask = target[0].expand(2, -1, -1), target[1].expand(2, -1)
    with torch.no_grad():
        assert torch.equal(loaded(tokens, memory, mask), tiny_decoder(tokens, memory, mask))


def test_encoder_round_trip(tmp_path, tiny_encoder):
    path = tmp_path / "encoder.pt"
    save_checkpoint(path, tiny_encoder, tiny_encoder.config)
    loaded = load_checkpoint(path)
    assert isinstance(loaded, Encoder)
    assert loaded.config == tiny_encoder.config
    assert not loaded.training
    smiles = torch.tensor([[5, 6, 7, 0]])
    with torch.no_grad():
        (memory, mask), (expected, expected_mask) = loaded(smiles), tiny_encoder(smiles)
    assert torch.equal(memory, expected) and torch.equal(mask, expected_mask)


def test_a_loaded_model_holds_the_weights_torch_load_read_without_copying_them(saved, monkeypatch):
    """The model is built on the meta device and given the loaded tensors themselves: no
    weight is allocated, initialised or copied only to be overwritten."""
    loaded_states = []
    load = torch.load

    def spy(*args, **kwargs):
        payload = load(*args, **kwargs)
        loaded_states.append(payload["state_dict"])
        return payload

    monkeypatch.setattr(torch, "load", spy)
    model = load_checkpoint(saved)
    [state] = loaded_states
    held = model.state_dict()
    assert held.keys() == state.keys()
    assert all(held[name].data_ptr() == tensor.data_ptr() for name, tensor in state.items())
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def test_the_bytes_checked_against_the_crcs_are_those_the_weights_were_loaded_with(
    saved, monkeypatch
):
    """A weight changed between the file and the model (here by torch.load itself) is
    refused: the CRCs are summed over the loaded tensors, not over a second read."""
    load = torch.load

    def changed(*args, **kwargs):
        payload = load(*args, **kwargs)
        payload["state_dict"]["head.4.bias"][0] += 1
        return payload

    monkeypatch.setattr(torch, "load", changed)
    with pytest.raises(ValueError, match=r"member '[^']*/data/\d+' does not match its CRC"):
        load_checkpoint(saved)


def test_file_is_a_plain_dict_with_the_config_and_no_buffers(saved, tiny_decoder):
    payload = torch.load(saved, weights_only=True)
    assert payload["format_version"] == FORMAT_VERSION
    assert payload["kind"] == "decoder"
    assert DecoderConfig.from_dict(payload["config"]) == tiny_decoder.config
    assert set(payload["state_dict"]) == set(tiny_decoder.state_dict())
    assert "causal" not in payload["state_dict"] and "positions" not in payload["state_dict"]


def test_a_file_carrying_code_is_refused_without_running_it(saved, tmp_path):
    marker = tmp_path / "code-ran"
    hostile = rewrite(saved, lambda p: p | {"config": RunsCode(marker)})
    with pytest.raises(ValueError, match=rf"refused to load {hostile}"):
        load_checkpoint(hostile)
    assert not marker.exists()
    # The payload is live: an unrestricted load runs it (so the check above can fail).
    torch.load(hostile, weights_only=False)
    assert marker.exists()


def test_save_refuses_a_config_that_is_not_the_models(tmp_path, tiny_decoder):
    path = tmp_path / "decoder.pt"
    other = DecoderConfig(d_model=64, nhead=4, dim_feedforward=64, num_layers=2)
    with pytest.raises(ValueError, match=r"config does not match model\.config"):
        save_checkpoint(path, tiny_decoder, other)
    assert not path.exists()


def test_save_refuses_what_is_not_a_reference_model(tmp_path):
    with pytest.raises(TypeError, match="model must be a reasyn_ref Decoder or Encoder"):
        save_checkpoint(tmp_path / "x.pt", torch.nn.Linear(2, 2), DecoderConfig.tiny())


def test_save_into_a_missing_folder_is_refused_naming_it(tmp_path, tiny_decoder):
    path = tmp_path / "no-such-folder" / "decoder.pt"
    with pytest.raises(ValueError, match=rf"the folder {tmp_path / 'no-such-folder'} does not"):
        save_checkpoint(path, tiny_decoder, tiny_decoder.config)
    assert not path.parent.exists()


def test_save_onto_a_folder_is_refused(tmp_path, tiny_decoder):
    with pytest.raises(ValueError, match=rf"cannot save to {tmp_path}: it is a folder"):
        save_checkpoint(tmp_path, tiny_decoder, tiny_decoder.config)


@pytest.mark.parametrize("path", [None, 3, b"x.pt"])
def test_save_and_load_refuse_a_path_that_is_not_one(tiny_decoder, path):
    with pytest.raises(TypeError, match=r"^path must be a str or os.PathLike"):
        save_checkpoint(path, tiny_decoder, tiny_decoder.config)
    with pytest.raises(TypeError, match=r"^path must be a str or os.PathLike"):
        load_checkpoint(path)


def test_a_missing_file_is_file_not_found_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"no checkpoint file at {tmp_path / 'x.pt'}"):
        load_checkpoint(tmp_path / "x.pt")


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(lambda whole: b"", id="empty"),
        pytest.param(lambda whole: whole[: len(whole) // 2], id="truncated"),
        pytest.param(lambda whole: whole[:100], id="cut in its header"),
        pytest.param(lambda whole: whole[:5000], id="cut in its first weights"),
        pytest.param(lambda whole: whole[:-22], id="cut before its end record"),
        pytest.param(lambda whole: whole[:-1], id="its last byte lost"),
        pytest.param(lambda whole: b"d_model: 768\nnhead: 16\n", id="text"),
        pytest.param(lambda whole: b"\x80\x02K\x01.", id="a bare pickle"),
    ],
)
def test_a_file_that_is_not_a_whole_checkpoint_is_refused_naming_it(saved, content):
    bad = saved.with_name("bad.pt")
    bad.write_bytes(content(saved.read_bytes()))
    with pytest.raises(ValueError) as refused:
        load_checkpoint(bad)
    assert str(bad) in str(refused.value)


def central_record(data: bytes) -> int:
    """Where the central-directory record of the first weight (``.../data/0``) starts."""
    return data.rindex(b"PK\x01\x02", 0, data.rindex(b"/data/0"))


def local_header(data: bytes) -> int:
    """Where the local header of the first weight starts (its name follows it)."""
    return data.rindex(b"PK\x03\x04", 0, data.index(b"/data/0"))


@pytest.mark.slow
def test_a_flipped_byte_is_refused_or_changes_no_weight(saved, tiny_decoder):
    """Bytes spread over the whole file, every byte of one weight's central-directory record
    (its attributes included: torch's zip reader takes a member marked a folder as empty) and
    every byte of the records that end the archive."""
    whole = saved.read_bytes()
    record = central_record(whole)
    ends = whole.rindex(b"PK\x06\x06")  # the zip64 end record, its locator, the end record
    positions = [
        *range(0, len(whole), len(whole) // 60),
        *range(record, record + 46),
        *range(ends, len(whole)),
    ]
    expected = tiny_decoder.state_dict()
    flipped = saved.with_name("flipped.pt")
    wrong = []
    for position in positions:
        data = bytearray(whole)
        data[position] ^= 0xFF
        flipped.write_bytes(data)
        try:
            loaded = load_checkpoint(flipped).state_dict()
        except ValueError as refused:
            assert str(flipped) in str(refused)
            continue
        if any(not torch.equal(loaded[name], expected[name]) for name in expected):
            wrong.append(position)
    assert wrong == [], f"flips at {wrong} loaded other weights without an error"


def test_a_weight_marked_a_folder_is_refused(saved):
    """torch's zip reader reads a member with the MS-DOS folder attribute as empty, and loads
    its weight as whatever memory it got, where Python's zipfile sees a whole file."""
    data = bytearray(saved.read_bytes())
    data[central_record(data) + 38] |= 0x10  # the low byte of the member's external attributes
    saved.write_bytes(data)
    with pytest.raises(ValueError, match=r"member '[^']*/data/0' is marked a folder"):
        load_checkpoint(saved)


# Changes to the first weight's zip records (APPNOTE.TXT 4.3.7, 4.3.12: a central record holds
# its flags at offset 8, its CRC at 16, its stored size and size at 20 and 24, where its local
# header lies at 42; a local header its flags at 6, its name from 30).


def encrypted_in_the_directory(data: bytearray) -> None:
    data[central_record(data) + 8] |= 0x01


def encrypted_in_its_local_header(data: bytearray) -> None:
    data[local_header(data) + 6] |= 0x01


def renamed_in_its_local_header(data: bytearray) -> None:
    data[local_header(data) + 30] = ord("X")


def stored_size_not_its_size(data: bytearray) -> None:
    data[central_record(data) + 20] ^= 0x01


def sizes_past_the_end(data: bytearray) -> None:
    record = central_record(data)
    data[record + 20 : record + 28] = len(data).to_bytes(4, "little") * 2


def local_header_past_the_end(data: bytearray) -> None:
    record = central_record(data)
    data[record + 42 : record + 46] = len(data).to_bytes(4, "little")


def local_header_signature_lost(data: bytearray) -> None:
    data[local_header(data)] ^= 0xFF


def another_crc(data: bytearray) -> None:
    data[central_record(data) + 16] ^= 0x01


NOT_AS_TORCH_SAVE_STORES = [
    (
        encrypted_in_the_directory,
        r"is compressed or encrypted \(method 0, flags 0x809\): torch\.save stores every",
    ),
    (encrypted_in_its_local_header, r"has a local header that does not match the directory's"),
    (renamed_in_its_local_header, r"has a local header that does not match the directory's"),
    (stored_size_not_its_size, r"holds \d+ bytes for a file of \d+"),
    (sizes_past_the_end, r"runs past the end of the file \(cut short\)"),
    (local_header_past_the_end, r"has its local header outside the file"),
    (local_header_signature_lost, r"has a local header that does not match the directory's"),
    (another_crc, r"does not match its CRC \(damaged\)"),
]


@pytest.mark.parametrize(
    ("change", "message"),
    NOT_AS_TORCH_SAVE_STORES,
    ids=[change.__name__ for change, _ in NOT_AS_TORCH_SAVE_STORES],
)
def test_a_weight_not_stored_as_torch_save_stores_it_is_refused(saved, change, message):
    data = bytearray(saved.read_bytes())
    change(data)
    saved.write_bytes(data)
    with pytest.raises(ValueError) as refused:
        load_checkpoint(saved)
    assert re.search(
        rf"^{saved} is not a whole checkpoint: member '[^']*/data/0' {message}", str(refused.value)
    )


def test_members_placed_before_the_start_of_the_file_are_refused(saved):
    """zipfile places every member by where the directory says it starts against where it
    lies: a directory said to start 1000 bytes later puts the first member 1000 bytes before
    the file."""
    data = bytearray(saved.read_bytes())
    end64 = data.rindex(b"PK\x06\x06")  # the zip64 end record; its directory offset at 48
    moved = int.from_bytes(data[end64 + 48 : end64 + 56], "little") + 1000
    data[end64 + 48 : end64 + 56] = moved.to_bytes(8, "little")
    saved.write_bytes(data)
    with pytest.raises(ValueError) as refused:
        load_checkpoint(saved)
    # Python 3.12's zipfile refuses such a directory itself; older ones read it, and the
    # loader finds the first member outside the file.
    assert re.search(
        rf"^{re.escape(str(saved))} is not a whole checkpoint.*(member '[^']*/data\.pkl' has its "
        r"local header outside|Corrupt zip64 end of central directory record)",
        str(refused.value),
    )


def test_a_compressed_archive_is_refused_though_torch_loads_it(saved):
    """torch's reader inflates a deflated member; torch.save never writes one, and the check
    reads the bytes it sums as they lie in the file."""
    rezipped = saved.with_name("deflated.pt")
    with (
        zipfile.ZipFile(saved) as source,
        zipfile.ZipFile(rezipped, "w", zipfile.ZIP_DEFLATED) as out,
    ):
        for member in source.infolist():
            out.writestr(member.filename, source.read(member))
    assert isinstance(torch.load(rezipped, weights_only=True), dict)
    with pytest.raises(
        ValueError, match=r"member '[^']*/data\.pkl' is compressed or encrypted \(method 8"
    ):
        load_checkpoint(rezipped)


def test_a_failed_save_keeps_the_earlier_checkpoint(saved, tiny_decoder, monkeypatch):
    before = saved.read_bytes()

    def failing_save(payload, path):
        Path(path).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(saved, tiny_decoder, tiny_decoder.config)
    assert saved.read_bytes() == before
    assert sorted(p.name for p in saved.parent.iterdir()) == [saved.name]


def wrong_shape(payload: dict) -> dict:
    state = dict(payload["state_dict"])
    state["head.4.bias"] = torch.zeros(271)
    return payload | {"state_dict": state}


def missing_and_unexpected(payload: dict) -> dict:
    state = dict(payload["state_dict"])
    del state["embed.weight"]
    state["extra.weight"] = torch.zeros(1)
    return payload | {"state_dict": state}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            wrong_shape,
            r"tensor 'head\.4\.bias' has shape \(271,\); the stored config builds \(272,\)",
            id="wrong shape",
        ),
        pytest.param(
            missing_and_unexpected,
            r"missing \['embed\.weight'\], unexpected \['extra\.weight'\]",
            id="missing and unexpected keys",
        ),
        pytest.param(
            lambda p: p | {"config": p["config"] | {"d_model": 64}},
            r"tensor 'embed\.weight' has shape \(272, 32\); the stored config builds \(272, 64\)",
            id="config disagrees with the weights",
        ),
        pytest.param(
            lambda p: p | {"config": p["config"] | {"depth": 3}},
            r"invalid decoder config: unknown DecoderConfig fields: depth",
            id="unknown config field",
        ),
        pytest.param(
            lambda p: p | {"config": p["config"] | {"nhead": 5}},
            r"invalid decoder config: d_model \(32\) must be divisible by nhead \(5\)",
            id="invalid config",
        ),
        pytest.param(
            lambda p: p | {"kind": "encoder"},
            r"invalid encoder config: unknown EncoderConfig fields",
            id="kind disagrees with the config",
        ),
        pytest.param(lambda p: p | {"kind": "head"}, r"has kind 'head'", id="unknown kind"),
        pytest.param(
            lambda p: p | {"kind": ["decoder"]}, r"has kind \['decoder'\]", id="kind a list"
        ),
        pytest.param(lambda p: p | {7: "x"}, r"is not a reasyn_ref checkpoint.*7", id="an int key"),
        pytest.param(
            lambda p: p | {"config": p["config"] | {7: 1}},
            r"invalid decoder config: unknown DecoderConfig fields: 7",
            id="an int config key",
        ),
        pytest.param(
            lambda p: p | {"config": p["config"] | {"end_token": 2.5}},
            r"invalid decoder config: DecoderConfig.end_token must be int, got 2.5",
            id="float end token",
        ),
        pytest.param(
            lambda p: p | {"config": p["config"] | {"pad_token": True}},
            r"invalid decoder config: DecoderConfig.pad_token must be int, got True",
            id="bool pad token",
        ),
        pytest.param(
            lambda p: p | {"config": "d_model=32"},
            r"invalid decoder config: a DecoderConfig must be given as a dict, got str",
            id="config not a dict",
        ),
        pytest.param(
            lambda p: p | {"state_dict": p["state_dict"] | {3: torch.zeros(1)}},
            r"unexpected \[3\]",
            id="an int state_dict key",
        ),
        pytest.param(
            lambda p: p | {"format_version": 2}, r"has format_version 2", id="newer format"
        ),
        pytest.param(
            lambda p: p | {"format_version": torch.tensor(FORMAT_VERSION)},
            r"has a format_version that is a torch.int64 tensor of shape \(\) on cpu; it must "
            r"be an int \(this reader knows 1\)",
            id="format version a tensor",
        ),
        pytest.param(
            lambda p: p | {"format_version": torch.ones(3, dtype=torch.long)},
            r"has a format_version that is a torch.int64 tensor of shape \(3,\)",
            id="format version a tensor of three",
        ),
        pytest.param(
            lambda p: p | {"format_version": True},
            r"has a format_version that is a bool; it must be an int",
            id="format version a bool",
        ),
        pytest.param(
            lambda p: p["state_dict"], r"is not a reasyn_ref checkpoint", id="bare state_dict"
        ),
    ],
)
def test_bad_checkpoints_are_refused(saved, change, message):
    bad = rewrite(saved, change)
    with pytest.raises(ValueError, match=message) as refused:
        load_checkpoint(bad)
    assert str(bad) in str(refused.value)


# --- nothing is built before the file is checked ----------------------------------------------


@pytest.fixture
def nothing_built(monkeypatch):
    """load_checkpoint fails the test if it builds a model (``model.with_weights``, its one way
    to build one): only refusals may pass."""

    def unbuildable(build, weights):
        raise AssertionError("a model was built from an unchecked checkpoint")

    monkeypatch.setattr(checkpoint, "with_weights", unbuildable)


def test_a_load_that_builds_a_model_fails_under_nothing_built(saved, nothing_built):
    """The guard the refusals below run under bites: a whole file does get built."""
    with pytest.raises(AssertionError, match=r"a model was built from an unchecked checkpoint"):
        load_checkpoint(saved)


def config_change(**fields):
    return lambda p: p | {"config": p["config"] | fields}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            config_change(num_layers=100_000),
            r"the stored config has 100000 layers, but the state_dict holds 45 tensors in all",
            id="100000 layers",
        ),
        pytest.param(
            config_change(d_model=2**16),
            r"tensor 'embed\.weight' has shape \(272, 32\); the stored config builds "
            r"\(272, 65536\)",
            id="d_model 65536",
        ),
        pytest.param(
            config_change(dim_feedforward=2**24),
            r"tensor 'transformer\.layers\.0\.linear1\.weight' has shape \(64, 32\)",
            id="a 2**24 feed-forward",
        ),
        pytest.param(
            config_change(vocab_size=10**7, reaction_tokens=[157, 272]),
            r"tensor 'embed\.weight' has shape \(272, 32\); the stored config builds "
            r"\(10000000, 32\)",
            id="a vocabulary of 10**7",
        ),
        pytest.param(
            config_change(max_len=10**6),
            rf"invalid decoder config: DecoderConfig\.max_len must be an int in "
            rf"\[1, MAX_LEN={MAX_LEN}\], got 1000000",
            id="max_len 10**6",
        ),
    ],
)
def test_a_config_asking_for_more_than_the_file_holds_is_refused_first(
    saved, nothing_built, change, message
):
    bad = rewrite(saved, change)
    with pytest.raises(ValueError, match=message) as refused:
        load_checkpoint(bad)
    assert str(bad) in str(refused.value)


def weight_change(name: str, make):
    """The payload with weight ``name`` replaced by ``make(weight)``."""

    def change(payload: dict) -> dict:
        state = dict(payload["state_dict"])
        state[name] = make(state[name])
        return payload | {"state_dict": state}

    return change


def with_value(value: float):
    def make(weight):
        weight = weight.clone()
        weight.view(-1)[3] = value
        return weight

    return make


BIAS = "head.4.bias"
NORM = "transformer.layers.1.norm2.weight"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            weight_change(BIAS, with_value(float("nan"))), r"holds NaN or infinite", id="NaN"
        ),
        pytest.param(
            weight_change(BIAS, with_value(float("-inf"))), r"holds NaN or infinite", id="-inf"
        ),
        pytest.param(weight_change(BIAS, lambda w: w.long()), r"is torch\.int64", id="int64"),
        pytest.param(weight_change(BIAS, lambda w: w.bool()), r"is torch\.bool", id="bool"),
        pytest.param(weight_change(BIAS, lambda w: w.double()), r"is torch\.float64", id="float64"),
        pytest.param(
            weight_change(BIAS, lambda w: w.to(torch.complex64)),
            r"is torch\.complex64",
            id="complex",
        ),
        pytest.param(weight_change(BIAS, lambda w: w.to("meta")), r"is on meta", id="meta"),
        pytest.param(
            weight_change(NORM, lambda w: w.to_sparse()), r"is torch\.sparse_coo", id="sparse"
        ),
        pytest.param(
            weight_change(NORM, lambda w: torch.ones(1).expand_as(w)),
            r"does not own exactly its bytes",
            id="one value viewed over every position",
        ),
        pytest.param(
            weight_change(NORM, lambda w: torch.ones(2 * w.numel())[w.numel() :]),
            r"does not own exactly its bytes",
            id="a view into a larger storage",
        ),
        pytest.param(
            weight_change("embed.weight", lambda w: w.t().contiguous().t()),
            r"does not own exactly its bytes",
            id="its own bytes in another order",
        ),
        pytest.param(
            lambda p: (
                p
                | {"state_dict": p["state_dict"] | {NORM: p["state_dict"][NORM.replace("2", "3")]}}
            ),
            r"does not own exactly its bytes",
            id="a storage shared by two weights",
        ),
    ],
)
def test_a_weight_no_checkpoint_holds_is_refused_naming_it(saved, nothing_built, change, message):
    bad = rewrite(saved, change)
    with pytest.raises(ValueError, match=message) as refused:
        load_checkpoint(bad)
    assert str(bad) in str(refused.value) and "tensor '" in str(refused.value)


def test_finite_weights_whose_sum_overflows_load_and_one_infinity_among_them_does_not(saved):
    huge = rewrite(saved, weight_change(BIAS, lambda w: torch.full_like(w, 3e38)))
    assert torch.equal(load_checkpoint(huge).state_dict()[BIAS], torch.full((272,), 3e38))
    one_inf = weight_change(BIAS, lambda w: with_value(float("inf"))(torch.full_like(w, 3e38)))
    with pytest.raises(ValueError, match=r"tensor 'head\.4\.bias' holds NaN or infinite"):
        load_checkpoint(rewrite(saved, one_inf))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_weights_stored_in_half_precision_load_exactly(saved, tiny_decoder, dtype):
    assert dtype in WEIGHT_DTYPES
    half = rewrite(
        saved,
        lambda p: p | {"state_dict": {name: t.to(dtype) for name, t in p["state_dict"].items()}},
    )
    loaded = load_checkpoint(half)
    for name, weight in tiny_decoder.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], weight.to(dtype).float()), name


def test_save_refuses_weights_a_checkpoint_cannot_hold(tmp_path, tiny_decoder):
    path = tmp_path / "decoder.pt"
    with torch.no_grad():
        tiny_decoder.head[-1].bias[0] = float("nan")
    with pytest.raises(ValueError, match=rf"cannot save to {path}: tensor 'head\.4\.bias' holds"):
        save_checkpoint(path, tiny_decoder, tiny_decoder.config)
    with pytest.raises(ValueError, match=r"tensor 'embed\.weight' is torch\.float64"):
        save_checkpoint(path, tiny_decoder.double(), tiny_decoder.config)
    assert list(tmp_path.iterdir()) == []


def test_a_model_saved_from_views_and_in_bf16_round_trips(tmp_path, tiny_decoder):
    """save copies each weight into a storage of its own, so what it writes always loads."""
    decoder = tiny_decoder.to(torch.bfloat16)
    with torch.no_grad():
        big = torch.zeros(2, *decoder.embed.weight.shape, dtype=torch.bfloat16)
        big[1] = decoder.embed.weight
        decoder.embed.weight.data = big[1]  # a view into a larger storage
    path = tmp_path / "decoder.pt"
    save_checkpoint(path, decoder, decoder.config)
    loaded = load_checkpoint(path)
    for name, weight in decoder.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], weight.float()), name


@pytest.mark.slow
def test_checking_a_file_against_its_config_does_not_import_dynamo(saved):
    """The skeleton the weights are checked against is built on the meta device, where the
    position tables, if computed, would import torch._dynamo (seconds, in every worker)."""
    script = (
        "import sys\n"
        "from reasyn_ref import load_checkpoint\n"
        f"load_checkpoint({str(saved)!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
