"""The machine a bench ran on: CPU, cores, system, Python and the frameworks' versions (bench.json's `machine`)."""
from __future__ import annotations

import os
import platform as platform_mod

from ... import train


def machine() -> dict:
    cpu = platform_mod.processor() or platform_mod.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    versions = train.versions()
    try:
        import torch

        versions["torch"] = torch.__version__
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform_mod.python_version(),
            "system": f"{platform_mod.system()} {platform_mod.release()}", "versions": versions}
