"""Where a GPT-2 124M bf16 step's GPU time goes: the top kernels of a few steps, torch.profiler's
table for torch_ref and the JAX profiler's device events (summed by kernel name) for jaxdp.

    python3 scripts/gpu/kernels.py jax|torch BATCH [platform] [n_layer]"""
from __future__ import annotations

import collections
import glob
import sys
import tempfile

from throughput import config

from jaxdp import devices

STEPS = 4


def jax_top(cfg, top: int = 12) -> str:
    import jax

    from jaxdp import train

    train.run(cfg.replace(steps=2), record=False, progress=False)  # compiled (and cached) outside the trace
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder):
        train.run(cfg.replace(steps=STEPS), record=False, progress=False)
    data = jax.profiler.ProfileData.from_file(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0])
    per = collections.Counter()
    for plane in data.planes:
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if "stream" in line.name.lower():
                    for e in line.events:
                        per[e.name] += e.duration_ns
    total = sum(per.values()) or 1.0
    rows = [f"{ns / 1e6 / STEPS:9.2f} ms/step {ns / total:6.1%}  {name[:110]}" for name, ns in per.most_common(top)]
    return f"jax: GPU kernel time {total / 1e6 / STEPS:.1f} ms/step over {STEPS} steps (incl. the first)\n" + \
        "\n".join(rows)


def torch_top(cfg, top: int = 12) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from jaxdp import models
    from jaxdp.core.run import data
    from torch_ref.train import train_rank

    init = models.initial_arrays(cfg, data.load(cfg.data, cfg.seed, cfg.seq_len))
    device = torch.device("cuda" if cfg.platform == "gpu" else "cpu")
    train_rank(0, 1, cfg.replace(steps=2), init, False, device=device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        train_rank(0, 1, cfg.replace(steps=STEPS), init, False, device=device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return f"torch: top ops over {STEPS} steps\n" + prof.key_averages().table(sort_by=key, row_limit=top,
                                                                              max_name_column_width=60)


def main(argv) -> int:
    framework, batch = argv[0], int(argv[1])
    platform = argv[2] if len(argv) > 2 else "gpu"
    cfg = config(batch, platform, int(argv[3]) if len(argv) > 3 else 12)
    devices.setup(1, platform)
    print(jax_top(cfg) if framework == "jax" else torch_top(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
