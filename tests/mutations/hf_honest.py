"""The transformers side of the honest matrix (`tests.mutations.honest`): the families of `hf_models`
(tiny configs, nothing downloaded, each with its trap named there), trained through `torch_ref.parallelize` and
recorded with `torch_ref.trace.Recorder`, as a user porting a model would: float64 and float32 models as
built, bfloat16 the way a torch user runs it, a float32 model under
`torch_ref.parallelize(..., compute_dtype=torch.bfloat16)` (autocast over float32 master parameters).

`run_world(rank, n, cases, promote)` runs every case of one world size and returns rank 0's traces. With
`promote`, float64 cases run with transformers' float32 sites promoted to float64 (`promoted_sites`, as
tests/jaxdp/models/test_llama.py does): the RMSNorms (Llama, Mistral, Qwen2, Gemma), the eager softmax
and the rotary angles compute in float32 whatever the model's dtype, so a float64 transformers model is
not a float64 model (docs/LIBRARY.md). Without it the judge reads those sites from the trace's precision
census.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .hf_models import IMAGE, IMAGES, PREFIX, SEQ, VOCAB, hf_model

BATCH, CLASSES = 12, 10
LR = {"adamw": 1e-2, "adam": 1e-2, "momentum": 0.05, "sgd": 0.05}
NAMES = {"vit": {"vit.embeddings.cls_token": "embeddings/cls_token",
                 "vit.embeddings.position_embeddings": "embeddings/position_embeddings"}}


def batch(name: str, k: int, dtype: str):
    """Step k's global batch (x, y): tokens and the next tokens, or images and labels."""
    rng = np.random.default_rng(k)
    if name in IMAGES:
        x = rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float64 if dtype == "float64" else np.float32)
        return x, rng.integers(0, CLASSES, size=BATCH)
    tokens = rng.integers(0, VOCAB, size=(BATCH, SEQ + 1))
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(out, y):
    """Cross-entropy as transformers' own losses compute it (transformers/loss/loss_utils.py): on the logits
    upcast to float32 when they are lower (bf16 autocast hands bf16 logits to a loss outside it)."""
    import torch
    import torch.nn.functional as F

    logits = out.logits.float() if out.logits.dtype in (torch.bfloat16, torch.float16) else out.logits
    return F.cross_entropy(logits.flatten(0, 1) if logits.dim() == 3 else logits, y.flatten())


def optimizer(name: str, params):
    """torch's optimizers with torch's defaults (AdamW: weight decay 0.01)."""
    import torch

    if name == "adamw":
        return torch.optim.AdamW(params, lr=LR[name])
    if name == "adam":
        return torch.optim.Adam(params, lr=LR[name])
    return torch.optim.SGD(params, lr=LR[name], momentum=0.9 if name == "momentum" else 0.0)


def meta(case: dict) -> dict:
    return {"model": f"hf-{case['model']}", "dtype": case["dtype"], "strategy": case["strategy"],
            "devices": case["devices"], "steps": case["steps"], "clip_norm": 0.0}


def record(case: dict, rank: int, n: int) -> tuple[dict, dict]:
    """One run of `case` (model, strategy, dtype, optimizer, steps): rank 0's (meta, arrays)."""
    import torch

    import torch_ref

    name, dtype = case["model"], case["dtype"]
    options = {"replicas": 2 if n % 2 == 0 else 1} if case["strategy"] == "hsdp" else {}
    if dtype == "bfloat16":
        options["compute_dtype"] = torch.bfloat16
    model, opt = torch_ref.parallelize(hf_model(name, dtype), strategy=case["strategy"],
                                       optimizer=lambda ps: optimizer(case["optimizer"], ps), **options)
    rows = slice(rank * BATCH // n, (rank + 1) * BATCH // n)
    with torch_ref.trace.Recorder(None, meta(case), model, names=NAMES.get(name), strip_prefix=PREFIX[name],
                                  optimizer=opt) as rec:
        rec.init()
        for k in range(1, case["steps"] + 1):
            x, y = batch(name, k, dtype)
            loss = torch_ref.train_step(model, opt, torch.from_numpy(x[rows]), torch.from_numpy(y[rows]), loss_fn)
            rec.step(k, loss, x, y)
    return rec.meta, rec.arrays


def rms_norm_in_dtype(self, h):
    """transformers' RMSNorm (Llama, Mistral, Qwen2), normalising in its input's dtype rather than float32."""
    import torch

    return self.weight * (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.variance_epsilon))


def gemma_norm_in_dtype(self, h):
    """Gemma's (1 + w) RMSNorm in its input's dtype rather than float32."""
    import torch

    return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def rotary_in_float64(self, x, position_ids):
    """transformers' rotary table (default scaling) from float64 angles rather than float32."""
    import torch

    dim = 2 * self.inv_freq.shape[0]
    config = getattr(self, "config", None)
    base = config.rope_parameters["rope_theta"] if config is not None else 1e4
    angles = position_ids[..., None].double() / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def promoted_sites():
    """A context manager: transformers' float32 sites in the model's dtype while it lasts (RMSNorms, softmax,
    rotary angles)."""
    import importlib

    import torch

    from . import _patched

    patches = [(torch.nn.functional, "softmax",
                lambda x, dim=None, dtype=None, _s=torch.nn.functional.softmax, **kw: _s(x, dim=dim))]
    for family, cls in (("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2"), ("gemma", "Gemma"),
                        ("gpt_neox", "GPTNeoX"), ("phi", "Phi"), ("falcon", "Falcon")):
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        patches.append((getattr(module, f"{cls}RotaryEmbedding"), "forward", rotary_in_float64))
        norm = getattr(module, f"{cls}RMSNorm", None)
        if norm is not None:
            patches.append((norm, "forward", gemma_norm_in_dtype if family == "gemma" else rms_norm_in_dtype))
    return _patched(patches)


def run_world(rank: int, n: int, cases: list, promote: bool = False) -> list:
    """Every case of world size n, in order: rank 0's (meta, arrays) of each (the other ranks: None)."""
    out = []
    for case in cases:
        promoted = promote and case["dtype"] == "float64"
        with promoted_sites() if promoted else contextlib.nullcontext():
            m, arrays = record(case, rank, n)
        out.append((m, arrays) if rank == 0 else None)
    return out
