"""GPT-2 124M (`--preset gpt2-124m`, bf16 compute, fp32 master weights) training throughput of `single`
on one device, one framework and one micro-batch per process (each gets the whole GPU), through the
bench's item (`jaxdp.harness.bench.gpu.throughput`); prints one JSON line.

    python3 scripts/gpu/throughput.py jax 16 [steps] [platform] [n_layer]
(platform cpu and a small n_layer check the script without a GPU)."""
from __future__ import annotations

import json
import sys

from jaxdp import devices
from jaxdp.core.run.config import RunConfig
from jaxdp.harness.bench import gpu


def config(batch: int, platform: str = "gpu", n_layer: int = 12) -> RunConfig:
    cfg = RunConfig(preset="gpt2-124m", strategy="single", devices=1, dtype="bfloat16", batch_size=batch,
                    platform=platform, optimizer="adamw", lr=6e-4, weight_decay=0.1, clip_norm=1.0)
    return cfg if n_layer == 12 else cfg.replace(n_layer=n_layer, d_model=64, n_head=4, seq_len=128)


def main(argv) -> int:
    framework, batch = argv[0], int(argv[1])
    steps = int(argv[2]) if len(argv) > 2 else 10
    platform = argv[3] if len(argv) > 3 else "gpu"
    cfg = config(batch, platform, int(argv[4]) if len(argv) > 4 else 12)
    devices.setup(1, platform)
    out = gpu.throughput(cfg, steps, frameworks=(framework,))
    row = out["frameworks"][framework]
    print(json.dumps({"framework": framework, "batch": batch, "device": out["device"], "psi": out["psi"],
                      "flops_per_token": out["flops_per_token"], "peak": out["peak_flops"], **row}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
