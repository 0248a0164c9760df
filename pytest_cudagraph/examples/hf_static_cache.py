"""A transformers ``StaticCache`` made the same way on every release since 4.45: its arguments
changed names (``max_batch_size`` -> ``batch_size`` -> taken from the first call in 5.x, as
``device`` and ``dtype`` are)."""

import inspect

from transformers import StaticCache


def static_cache(model, batch, length):
    """A static KV cache of ``length`` positions for ``batch`` rows of ``model``."""
    wanted = inspect.signature(StaticCache.__init__).parameters
    given = {
        "config": model.config,
        "max_cache_len": length,
        "device": model.device,
        "dtype": model.dtype,
    }
    given["batch_size" if "batch_size" in wanted else "max_batch_size"] = batch
    return StaticCache(**{name: value for name, value in given.items() if name in wanted})
