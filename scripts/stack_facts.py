"""Print the running stack as JSON: Python, torch, CUDA, driver, GPUs, date."""

from __future__ import annotations

import datetime
import json
import platform

import torch


def stack_facts() -> dict:
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpus": [],
        "driver": None,
    }
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        facts["gpus"].append(f"{props.name} ({props.total_memory / 2**30:.0f} GiB)")
    try:
        import pynvml

        pynvml.nvmlInit()
        facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as exc:  # NVML missing is a fact to report, not an error
        facts["driver"] = f"n/a ({exc})"
    return facts


if __name__ == "__main__":
    print(json.dumps(stack_facts(), indent=2))
