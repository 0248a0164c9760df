"""Checkpoints: a model's weights and the config they were built with, in one plain dict.

Files are written with ``torch.save`` (a zip archive) and read back with
``torch.load(weights_only=True)``, so loading never runs code a file carries. Nothing is built
from a file before it is checked whole: its zip directory and every member's place in it, the
members that hold no weight against their CRCs, then (once torch.load has read it) its config,
every weight's name, shape, dtype and layout against what that config builds, on a skeleton
that allocates nothing (``model.skeleton``), and every weight's bytes, as loaded, against its
member's CRC: a flipped or lost byte is found, and a weight's bytes are read from the file once.
Whatever is wrong with a file's content is a ValueError naming the path and the rule.
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
import struct
import zipfile
import zlib
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from .checks import describe
from .config import DecoderConfig, EncoderConfig
from .model import LAYERS, Decoder, Encoder, skeleton, with_weights

FORMAT_VERSION = 1

# kind stored in the file -> (model class, config class)
KINDS: dict[str, tuple[type[Decoder | Encoder], type[DecoderConfig | EncoderConfig]]] = {
    "decoder": (Decoder, DecoderConfig),
    "encoder": (Encoder, EncoderConfig),
}
PAYLOAD_KEYS = {"format_version", "kind", "config", "state_dict"}

# The dtypes a weight may be stored in: the model is built in float32, which holds each exactly.
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# The MS-DOS directory attribute of a zip member: torch's zip reader (miniz) reads a member
# carrying it as an empty folder, Python's zipfile does not look at it.
DOS_DIRECTORY = 0x10
# A zip member's local header (APPNOTE.TXT 4.3.7): 30 bytes from its signature, its flags at
# offset 6, its name's and extra field's lengths at 26 and 28; then the name, the extra field
# and the member's bytes.
LOCAL_HEADER = struct.Struct("<4s2xH18xHH")
LOCAL_SIGNATURE = b"PK\x03\x04"
UTF8_NAME = 0x800  # a flag: the name is UTF-8, not code page 437
REFUSED_FLAGS = 0x1 | 0x20 | 0x40  # encrypted, patched data, strongly encrypted


def save_checkpoint(
    path: str | os.PathLike[str],
    model: Decoder | Encoder,
    config: DecoderConfig | EncoderConfig,
) -> None:
    """Write ``model``'s weights with ``config`` (which must be ``model.config``) to ``path``.

    Every weight must be one ``load_checkpoint`` takes (``check_weights``). The file is written
    beside ``path`` and moved into place, so a failed save leaves any earlier checkpoint there
    intact.
    """
    path = _checked_path(path)
    kind = next((k for k, (cls, _) in KINDS.items() if isinstance(model, cls)), None)
    if kind is None:
        raise TypeError(
            f"model must be a reasyn_ref Decoder or Encoder, got {type(model).__name__}"
        )
    if not path.parent.is_dir():
        raise ValueError(f"cannot save to {path}: the folder {path.parent} does not exist")
    if path.is_dir():
        raise ValueError(f"cannot save to {path}: it is a folder")
    if config != model.config:
        raise ValueError(
            f"config does not match model.config: a checkpoint stores the config its weights were "
            f"built with ({config!r} != {model.config!r})"
        )
    # Dense CPU copies of their own, so each weight owns exactly its bytes in the file.
    state = {
        name: t.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
        for name, t in model.state_dict().items()
    }
    check_weights(f"cannot save to {path}", state)
    payload = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "config": config.to_dict(),
        "state_dict": state,
    }
    partial = path.with_name(path.name + ".partial")
    try:
        torch.save(payload, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def load_checkpoint(path: str | os.PathLike[str]) -> Decoder | Encoder:
    """The Decoder or Encoder stored at ``path``, in eval mode on the CPU; its config is
    ``model.config``. A missing file is a FileNotFoundError; anything wrong with the file's
    content is a ValueError naming ``path``, raised before any model is built."""
    path = _checked_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    # One open file for all of it, and each weight's bytes read once: torch.load reads them
    # into the tensors the model is given, and those very bytes are checked against the CRCs.
    with path.open("rb") as file:
        archive = Archive.read(path, file)
        file.seek(0)
        payload = _torch_load(path, file)
    config, state = check_payload(path, payload)
    check_state_dict(path, state, config)
    archive.check_weights_bytes(state)
    # The model is float32: a weight stored in half precision is widened (exactly), one stored
    # in float32 becomes a parameter as it was loaded, without a copy.
    weights = {name: t.float() for name, t in state.items()}
    if isinstance(config, DecoderConfig):
        return with_weights(lambda: Decoder(config), weights)
    return with_weights(lambda: Encoder(config), weights)


def _torch_load(path: Path, file: BinaryIO) -> object:
    """``torch.load`` of the file, weights only (it runs no code a file carries), its errors
    as ValueErrors naming ``path``."""
    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"refused to load {path}: it holds pickled objects or code that weights-only loading "
            f"does not allow, or is not a torch.save file ({exc})"
        ) from exc
    except (RuntimeError, EOFError, KeyError, ValueError, TypeError, AttributeError) as exc:
        # What torch.load raises for a whole archive that torch.save did not write.
        raise ValueError(
            f"{path} is not a readable checkpoint (not written by torch.save): "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def check_payload(path: Path, payload: object) -> tuple[DecoderConfig | EncoderConfig, Any]:
    """The loaded file is a checkpoint of this format: its keys, version, kind and config;
    returns the config and the state_dict (for ``check_state_dict`` to check against it)."""
    if not isinstance(payload, dict) or set(payload) != PAYLOAD_KEYS:
        found = sorted(payload, key=repr) if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(
            f"{path} is not a reasyn_ref checkpoint: expected a dict with keys "
            f"{sorted(PAYLOAD_KEYS)}, found {found}"
        )
    version = payload["format_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(
            f"{path} has a format_version that is a {describe(version)}; it must be an int "
            f"(this reader knows {FORMAT_VERSION})"
        )
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {version}; this reader knows {FORMAT_VERSION}")
    kind = payload["kind"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"{path} has kind {kind!r}; expected one of {sorted(KINDS)}")
    try:
        config = KINDS[kind][1].from_dict(payload["config"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path} holds an invalid {kind} config: {exc}") from exc
    return config, payload["state_dict"]


@dataclass(frozen=True)
class Archive:
    """A checkpoint file's zip directory, its members checked as torch.save writes them, and
    every member that holds no weight checked against its CRC (``read``); the weights' own
    bytes are checked once torch.load has read them (``check_weights_bytes``)."""

    path: Path
    weight_members: tuple[zipfile.ZipInfo, ...]

    @classmethod
    def read(cls, path: Path, file: BinaryIO) -> Archive:
        """The directory of the open ``file`` (at ``path``) and its members' local headers,
        checked; the members that hold no weight (the pickle, torch's records) read and summed."""
        size = os.fstat(file.fileno()).st_size
        try:
            with zipfile.ZipFile(file) as archive:
                members = archive.infolist()
        except (zipfile.BadZipFile, ValueError, NotImplementedError) as exc:
            # What zipfile raises on a cut or damaged directory, each seen when its bytes are
            # changed: no end record or a bad one, a name that is not text, an unknown version.
            raise ValueError(
                f"{path} is not a whole checkpoint (truncated, damaged or not a torch.save zip "
                f"archive): {exc}"
            ) from exc
        for member in members:
            problem = member_problem(file, size, member)
            if problem is not None:
                raise ValueError(
                    f"{path} is not a whole checkpoint: member {member.filename!r} {problem}"
                )
            if not holds_a_weight(member) and zlib.crc32(member_bytes(file, member)) != member.CRC:
                raise ValueError(f"{path} is not a whole checkpoint: {damaged(member)}")
        return cls(path, tuple(member for member in members if holds_a_weight(member)))

    def check_weights_bytes(self, state: Mapping[str, Tensor]) -> None:
        """Every weight member's CRC matches the bytes torch.load read into one of ``state``'s
        tensors (a tensor's bytes are its storage's: ``check_weights`` has them own it)."""
        storages = [tensor.untyped_storage() for tensor in state.values()]
        # zlib lets go of the GIL while it sums, so the weights are summed side by side, on as
        # many threads as torch's own CPU work may take (a worker sharing the host's cores
        # sets 1).
        with ThreadPoolExecutor(max_workers=torch.get_num_threads()) as pool:
            sums = list(pool.map(storage_crc, storages))
        loaded = Counter(zip([storage.nbytes() for storage in storages], sums, strict=True))
        for member in self.weight_members:
            if not loaded[member.file_size, member.CRC]:
                raise ValueError(f"{self.path} is not a whole checkpoint: {damaged(member)}")
            loaded[member.file_size, member.CRC] -= 1


def storage_crc(storage: torch.UntypedStorage) -> int:
    """The CRC-32 of ``storage``'s bytes, read in place."""
    size = storage.nbytes()
    if not size:
        return zlib.crc32(b"")
    return zlib.crc32((ctypes.c_char * size).from_address(storage.data_ptr()))


def holds_a_weight(member: zipfile.ZipInfo) -> bool:
    """torch.save writes each storage as ``ARCHIVE/data/KEY``."""
    return member.filename.rsplit("/", 2)[-2:-1] == ["data"]


def member_bytes(file: BinaryIO, member: zipfile.ZipInfo) -> bytes:
    """A stored member's bytes, as they lie in the file (``member_problem`` found it whole)."""
    file.seek(member.header_offset)
    _, _, name_length, extra_length = LOCAL_HEADER.unpack(file.read(LOCAL_HEADER.size))
    file.seek(member.header_offset + LOCAL_HEADER.size + name_length + extra_length)
    return file.read(member.compress_size)


def damaged(member: zipfile.ZipInfo) -> str:
    return f"member {member.filename!r} does not match its CRC (damaged)"


def member_problem(file: BinaryIO, size: int, member: zipfile.ZipInfo) -> str | None:
    """What is wrong with ``member`` of the zip ``file`` (``size`` bytes long), None when
    nothing is: it must be a plain file stored as torch.save stores every member (not
    compressed, not encrypted), and its local header must name it and lie, with its bytes,
    inside the file."""
    if member.is_dir() or member.external_attr & DOS_DIRECTORY:
        return "is marked a folder"
    if member.flag_bits & REFUSED_FLAGS or member.compress_type != zipfile.ZIP_STORED:
        return (
            f"is compressed or encrypted (method {member.compress_type}, flags "
            f"{member.flag_bits:#x}): torch.save stores every member as it is"
        )
    start = member.header_offset
    if start < 0 or start + LOCAL_HEADER.size > size:
        return "has its local header outside the file"
    file.seek(start)
    signature, flags, name_length, extra_length = LOCAL_HEADER.unpack(file.read(LOCAL_HEADER.size))
    # The name as the central directory holds it, encoded back as zipfile decoded it.
    name = member.orig_filename.encode("utf-8" if member.flag_bits & UTF8_NAME else "cp437")
    if signature != LOCAL_SIGNATURE or flags & REFUSED_FLAGS or file.read(name_length) != name:
        return "has a local header that does not match the directory's"
    if member.compress_size != member.file_size:
        return f"holds {member.compress_size} bytes for a file of {member.file_size}"
    if start + LOCAL_HEADER.size + name_length + extra_length + member.compress_size > size:
        return "runs past the end of the file (cut short)"
    return None


def check_state_dict(
    path: str | os.PathLike[str], state: Any, config: DecoderConfig | EncoderConfig
) -> None:
    """The names and shapes of ``state`` must be exactly those the model of ``config`` holds,
    and each weight one a checkpoint may hold (``check_weights``), all checked without building
    that model: a config asking for more than the file holds is refused first."""
    if not isinstance(state, dict) or not all(isinstance(t, Tensor) for t in state.values()):
        raise ValueError(f"{path}: state_dict must be a dict of tensors")
    if config.num_layers > len(state):  # each layer holds weights of its own
        raise ValueError(
            f"{path}: the stored config has {config.num_layers} layers, but the state_dict holds "
            f"{len(state)} tensors in all"
        )
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected), key=repr)
    if missing or unexpected:
        raise ValueError(
            f"{path}: state_dict does not fit the stored config: missing {missing}, "
            f"unexpected {unexpected}"
        )
    for name, tensor in state.items():
        if tensor.shape != expected[name]:
            raise ValueError(
                f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}; the stored config "
                f"builds {tuple(expected[name])}"
            )
    check_weights(str(path), state)


def expected_shapes(config: DecoderConfig | EncoderConfig) -> dict[str, torch.Size]:
    """The name and shape of every weight the model of ``config`` holds: its one-layer
    skeleton's, with layer 0's repeated for each of ``config.num_layers``."""
    one_layer = {name: t.shape for name, t in skeleton(config).state_dict().items()}
    first = f"{LAYERS}0."
    shapes = {name: shape for name, shape in one_layer.items() if not name.startswith(first)}
    for layer in range(config.num_layers):
        for name, shape in one_layer.items():
            if name.startswith(first):
                shapes[f"{LAYERS}{layer}.{name[len(first) :]}"] = shape
    return shapes


def check_weights(where: str, state: Mapping[str, Tensor]) -> None:
    """Each weight a dense CPU tensor of a ``WEIGHT_DTYPES`` dtype that owns exactly its bytes
    (contiguous, its storage its own; so loading takes no more memory than the file holds, where
    a stride-0 view or a storage shared by many tensors could ask for far more), finite; else a
    ValueError starting with ``where`` and naming the tensor."""
    storages: set[int] = set()
    for name, tensor in state.items():
        if tensor.layout != torch.strided:
            raise ValueError(f"{where}: tensor {name!r} is {tensor.layout}; weights are dense")
        if tensor.device.type != "cpu":
            raise ValueError(
                f"{where}: tensor {name!r} is on {tensor.device}; a checkpoint holds CPU tensors "
                "with their values"
            )
        if tensor.dtype not in WEIGHT_DTYPES:
            allowed = ", ".join(map(str, WEIGHT_DTYPES))
            raise ValueError(
                f"{where}: tensor {name!r} is {tensor.dtype}; weights must be one of {allowed}"
            )
        storage = tensor.untyped_storage()
        address = storage.data_ptr() if storage.nbytes() else None  # empty ones share 0
        owned = (
            tensor.is_contiguous()
            and tensor.storage_offset() == 0
            and storage.nbytes() == tensor.numel() * tensor.element_size()
            and address not in storages
        )
        if not owned:
            raise ValueError(
                f"{where}: tensor {name!r} does not own exactly its bytes (a view, strided, or "
                "sharing its storage with another tensor)"
            )
        if address is not None:
            storages.add(address)
        # One pass, exact: NaN carries through a minimum and a maximum, and an infinity is one
        # of them (isfinite would write a mask of the whole tensor and read it again).
        if tensor.numel() and not all(map(math.isfinite, torch.aminmax(tensor))):
            raise ValueError(f"{where}: tensor {name!r} holds NaN or infinite values")


def _checked_path(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)
