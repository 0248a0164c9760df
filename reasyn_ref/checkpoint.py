"""Checkpoints: a model's weights and the config they were built with, in one plain dict.

Files are written with ``torch.save`` and read back with ``torch.load(weights_only=True)``, so
loading never runs code a file carries. Whatever is wrong with a file (code in it, truncated,
empty, not a checkpoint, a config or weights that do not fit) is a ValueError naming the path.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .config import DecoderConfig, EncoderConfig
from .model import Decoder, Encoder

FORMAT_VERSION = 1

# kind stored in the file -> (model class, config class)
KINDS = {
    "decoder": (Decoder, DecoderConfig),
    "encoder": (Encoder, EncoderConfig),
}
PAYLOAD_KEYS = {"format_version", "kind", "config", "state_dict"}


def save_checkpoint(
    path: str | os.PathLike[str],
    model: Decoder | Encoder,
    config: DecoderConfig | EncoderConfig,
) -> None:
    """Write ``model``'s weights with ``config`` (which must be ``model.config``) to ``path``.

    The file is written beside ``path`` and moved into place, so a failed save leaves any
    earlier checkpoint there intact.
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
    payload = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "config": config.to_dict(),
        "state_dict": {name: t.detach().cpu() for name, t in model.state_dict().items()},
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
    content is a ValueError naming ``path``."""
    path = _checked_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"refused to load {path}: it holds pickled objects or code that weights-only loading "
            f"does not allow, or is not a torch.save file ({exc})"
        ) from exc
    except (RuntimeError, EOFError, KeyError, ValueError, TypeError, AttributeError) as exc:
        # What torch.load raises for an empty, truncated or foreign file.
        raise ValueError(
            f"{path} is not a readable checkpoint (empty, truncated or not written by "
            f"torch.save): {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(payload, dict) or set(payload) != PAYLOAD_KEYS:
        found = sorted(payload, key=repr) if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(
            f"{path} is not a reasyn_ref checkpoint: expected a dict with keys "
            f"{sorted(PAYLOAD_KEYS)}, found {found}"
        )
    if payload["format_version"] != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version {payload['format_version']!r}; this reader knows "
            f"{FORMAT_VERSION}"
        )
    kind = payload["kind"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"{path} has kind {kind!r}; expected one of {sorted(KINDS)}")
    model_class, config_class = KINDS[kind]
    try:
        config = config_class.from_dict(payload["config"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path} holds an invalid {kind} config: {exc}") from exc
    model = model_class(config)
    check_state_dict(path, payload["state_dict"], model.state_dict())
    model.load_state_dict(payload["state_dict"])
    return model.eval()


def check_state_dict(path: str | os.PathLike[str], state: Any, expected: dict[str, Tensor]) -> None:
    """Names and shapes of ``state`` must be exactly those the stored config builds."""
    if not isinstance(state, dict) or not all(isinstance(t, Tensor) for t in state.values()):
        raise ValueError(f"{path}: state_dict must be a dict of tensors")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected), key=repr)
    if missing or unexpected:
        raise ValueError(
            f"{path}: state_dict does not fit the stored config: missing {missing}, "
            f"unexpected {unexpected}"
        )
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}; the stored config "
                f"builds {tuple(expected[name].shape)}"
            )


def _checked_path(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)
