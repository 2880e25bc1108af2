"""Item 7: bf16 `gpt` training throughput of `single` on one GPU, both frameworks: tokens/s, TFLOP/s
and MFU against the datasheet peak."""
from __future__ import annotations

import math

import jax
import numpy as np

from ... import models
from ...core.run import data
from ...core.run.config import RunConfig
from ...core.run.timing import timing
from .measure import run_jax
from .plan import Plan
from .tables import ratio

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, FLOP/s.
PEAK_BF16 = (("H100 PCIe", 756e12, "NVIDIA H100 PCIe datasheet: 756 TFLOP/s bf16 dense"),
             ("H100", 989e12, "NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 dense (1979 with sparsity)"),
             ("H200", 989e12, "NVIDIA H200 SXM datasheet: 989 TFLOP/s bf16 dense"),
             ("A100", 312e12, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense"))
FLOPS_FORMULA = ("FLOPs per token = 6 x Psi (all parameters, embeddings included) + 6 x n_layer x seq_len x "
                 "d_model (attention scores and weighted sum, forward + backward, the causal half: llm.c's "
                 "gpt2_estimate_mfu; nanoGPT's 12 x ... counts the masked half too, recorded as mfu_nanogpt)")
CONFIG_FIELDS = ("n_layer", "n_head", "d_model", "seq_len", "batch_size", "dtype")


def gpu_available() -> dict:
    try:
        jax_gpu = bool(jax.devices("gpu"))
    except RuntimeError:
        jax_gpu = False
    try:
        import torch

        torch_gpu = torch.cuda.is_available()
    except ImportError:
        torch_gpu = False
    return {"jax": jax_gpu, "torch": torch_gpu}


def flops_per_token(psi: int, cfg: RunConfig, attention: float = 6.0) -> float:
    """llm.c's count (attention 6: the causal half); nanoGPT's estimate_mfu is attention=12."""
    return 6.0 * psi + attention * cfg.n_layer * cfg.seq_len * cfg.d_model


def peak_flops(device_kind: str):
    for name, peak, source in PEAK_BF16:
        if all(word.lower() in device_kind.lower() for word in name.split()):
            return peak, source
    return None, f"no datasheet peak known for {device_kind!r}"


def _torch_step_times(cfg: RunConfig, dataset) -> list:
    import torch

    from torch_ref.train import train_rank

    from ... import models

    device = torch.device("cuda" if cfg.platform == "gpu" else "cpu")
    return train_rank(0, 1, cfg, models.initial_arrays(cfg, dataset), False, device=device).step_times


def throughput(cfg: RunConfig, steps: int, frameworks=("torch", "jax")) -> dict:
    """bf16 `gpt` training throughput of `single` on one device of cfg.platform, in `frameworks` (torch
    first: its cached memory is handed back before JAX's allocator grows; a separate process for each
    gives each the whole GPU). (platform 'cpu' runs the same code path, for testing it without a GPU.)"""
    cfg = cfg.replace(steps=steps).validate("jax")
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    with jax.default_device(jax.devices("cpu")[0]):
        psi = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(models.init(cfg, dataset).params))
    per_token = flops_per_token(psi, cfg)
    tokens = cfg.batch_size * cfg.seq_len
    kind = jax.devices(cfg.platform)[0].device_kind if cfg.platform != "auto" else jax.devices()[0].device_kind
    peak, source = peak_flops(kind) if cfg.platform == "gpu" else (None, "CPU: no datasheet peak")
    out = {"measured": True, "device": kind, "config": {k: getattr(cfg, k) for k in CONFIG_FIELDS}, "psi": psi,
           "flops_per_token": per_token, "flops_formula": FLOPS_FORMULA, "peak_flops": peak, "peak_source": source,
           "frameworks": {}}

    def record(fw, step_times, note=""):
        t = timing(step_times)
        tflops = per_token * tokens / t["median_step_s"]
        nanogpt = flops_per_token(psi, cfg, 12.0) * tokens / t["median_step_s"]
        out["frameworks"][fw] = {**t, "tokens_per_s": tokens / t["median_step_s"], "tflops": tflops / 1e12,
                                 "mfu": tflops / peak if peak else None,
                                 "mfu_nanogpt": nanogpt / peak if peak else None, "note": note}

    if "torch" in frameworks:
        try:
            record("torch", _torch_step_times(cfg, dataset), "eager (torch_ref has no torch.compile switch)")
        except Exception as e:  # report, never hide: the JAX number stands on its own
            out["frameworks"]["torch"] = {"error": f"{type(e).__name__}: {e}"}
        _free_torch_cache()
    if "jax" in frameworks:
        record("jax", run_jax(cfg)["step_times"])
    j, t = out["frameworks"].get("jax", {}), out["frameworks"].get("torch", {})
    out["jax_over_torch_tokens_per_s"] = ratio(j.get("tokens_per_s", math.nan), t.get("tokens_per_s", math.nan))
    return out


def _free_torch_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gpu_throughput(p: Plan, say) -> dict:
    have = gpu_available()
    if not (have["jax"] and have["torch"]):
        return {"measured": False, "reason": "not measured: no GPU on this machine", "gpu_seen": have,
                "flops_formula": FLOPS_FORMULA, "peak_source": PEAK_BF16[1][2],
                "config": {k: getattr(p.gpu_model, k) for k in CONFIG_FIELDS}}
    say("bench: GPU throughput, bf16 gpt on one device")
    cfg = p.gpu_model if not p.quick else p.gpu_model.replace(n_layer=2, d_model=256, n_head=4, seq_len=256)
    return throughput(cfg, p.gpu_steps)
