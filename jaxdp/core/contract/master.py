"""Where the master copy lives: the dtype of the parameters the step updates and of the optimizer's floating
state (Adam's moments), against the intent's `master_dtype`. A model cast whole to bf16 before it is wrapped
(`model.to(torch.bfloat16)`, `jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)`) trains: the loss
falls for a while, but every update smaller than half a bf16 step of its weight (2^-8 of it) rounds away, and
Adam's second moment loses what float32 keeps. Mixed precision keeps a float32 master and computes in bf16
from it (a cast inside the loss, FSDP2's MixedPrecisionPolicy, torch.autocast): no finding.

`held` maps what was read ("parameters", "optimizer state") to the floating dtypes of its arrays (by name:
'float32', 'bfloat16', ...); scalars (a step count) are not read."""
from __future__ import annotations

from .intent import Intent
from .report import Finding

NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64", "half": "float16"}


def name(dtype) -> str:
    """A dtype's name as the intents spell it (numpy's, jax's or torch's dtype, or its string)."""
    text = str(dtype).removeprefix("torch.")
    return NAMES.get(text, text)


def findings(held: dict[str, set[str]], want: Intent) -> list[Finding]:
    """One `master-dtype` finding when the parameters or the optimizer state are held in another dtype than
    `want.master_dtype` (nothing when `held` is empty: not read)."""
    off = {what: sorted(d - {want.master_dtype}) for what, d in held.items() if d - {want.master_dtype}}
    if not off:
        return []
    said = " and ".join(f"the {what} in {'+'.join(d)}" for what, d in off.items())
    low = any(d in ("bfloat16", "float16") for ds in off.values() for d in ds)
    why = (": each update smaller than half a step of the weight's low-precision spacing rounds away, and the "
           "run drifts from its float32 twin" if low else ": the optimizer updates another copy than the one meant")
    return [Finding("master-dtype", f"the step updates {said}, not {want.master_dtype}{why}",
                    f"keep the parameters and the optimizer state in {want.master_dtype} and compute in low "
                    f"precision from them (JAX: cast inside the loss, p.astype(jnp.bfloat16), not the params "
                    f"before tx.init; torch: no model.to(torch.bfloat16) before wrapping: "
                    f"fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)) or "
                    f"torch.autocast), or check against --master-dtype if that dtype was meant")]
