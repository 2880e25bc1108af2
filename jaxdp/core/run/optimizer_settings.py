"""The optimizer's settings as a trace's meta keys (docs/TRACE.md): what both Recorders' `optimizer=`
takes, so that `jaxdp diff` replays the optimizer the run trained with (jaxdp/judge/error_model.py).

    Recorder(path, meta, optimizer={"name": "adamw", "lr": 1e-3, "weight_decay": 0.01, "clip_norm": 1.0})
    torch_ref.trace.Recorder(path, meta, model, optimizer=opt)     # a torch.optim optimizer: its param_groups

Keys of the dict (torch.optim's names): name (sgd, momentum, adam, adamw), lr, weight_decay, betas, eps,
momentum, clip_norm; written as meta `optimizer`, `lr`, `weight_decay`, `adam_betas`, `adam_eps`,
`momentum`, `clip_norm`. An optax optimizer does not expose its settings: give the dict.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError

META = {"name": "optimizer", "lr": "lr", "weight_decay": "weight_decay", "betas": "adam_betas", "eps": "adam_eps",
        "momentum": "momentum", "clip_norm": "clip_norm"}
EXAMPLE = "optimizer={'name': 'adamw', 'lr': 1e-3, 'weight_decay': 0.01}"
TORCH = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw"}


def settings(optimizer) -> dict:
    """The meta keys for `optimizer`: a dict of settings or a torch.optim optimizer (also wrapped, as
    ZeroRedundancyOptimizer wraps it)."""
    if isinstance(optimizer, Mapping):
        return _from_dict(optimizer)
    if hasattr(optimizer, "param_groups"):
        return _from_torch(optimizer)
    raise ConfigError(f"optimizer={type(optimizer).__name__}: give a dict of its settings (an optax optimizer does "
                      f"not expose them), e.g. {EXAMPLE}")


def _from_dict(d: Mapping) -> dict:
    unknown = sorted(set(d) - set(META))
    if unknown:
        raise ConfigError(f"optimizer settings {unknown} unknown; valid: {', '.join(META)}; e.g. {EXAMPLE}")
    if "name" not in d or "lr" not in d:
        raise ConfigError(f"optimizer settings need 'name' and 'lr'; e.g. {EXAMPLE}")
    out = {}
    for key, value in d.items():
        if key == "name":
            out["optimizer"] = str(value)
        elif key == "betas":
            out["adam_betas"] = [_number(key, b) for b in value]
        else:
            out[META[key]] = _number(key, value)
    out.setdefault("weight_decay", 0.0)
    return out


def _number(key: str, value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"optimizer setting {key}={value!r} is not a number; e.g. {EXAMPLE}") from None


def _from_torch(opt) -> dict:
    """name, lr, weight_decay, betas, eps, momentum of a torch optimizer whose param groups agree."""
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer: the local optimizer it wraps
    cls = type(inner).__name__
    groups = [{k: g[k] for k in ("lr", "weight_decay", "betas", "eps", "momentum", "nesterov", "dampening", "amsgrad")
               if k in g} for g in opt.param_groups]
    differ = sorted({k for g in groups[1:] for k in g if g[k] != groups[0].get(k)})
    if differ:
        raise ConfigError(f"the optimizer's param groups differ in {', '.join(differ)}: the trace records one "
                          f"setting each; give the settings that hold for all, e.g. {EXAMPLE}")
    g = groups[0]
    name = TORCH.get(cls, cls.lower())
    if cls == "SGD":
        name = "momentum" if g.get("momentum", 0) else "sgd"
        if g.get("nesterov") or g.get("dampening", 0):
            name = "sgd-nesterov" if g.get("nesterov") else "sgd-dampened"  # not replayed: a note says so
    if g.get("amsgrad"):
        name += "-amsgrad"
    d = {"name": name, "lr": float(g["lr"]), "weight_decay": g.get("weight_decay", 0.0)}
    d |= {"betas": g["betas"], "eps": g["eps"]} if "betas" in g else {}
    d |= {"momentum": g["momentum"]} if name == "momentum" else {}
    return _from_dict(d)


def merged(meta: dict, optimizer) -> dict:
    """`meta` with the settings of `optimizer` (None: as it is); a meta key that says otherwise is an error."""
    if optimizer is None:
        return dict(meta)
    found = settings(optimizer)
    clash = [f"{k} {meta[k]!r} in meta, {v!r} in the optimizer" for k, v in found.items() if k in meta and meta[k] != v]
    if clash:
        raise ConfigError(f"meta says otherwise than the optimizer: {'; '.join(clash)}; drop those keys from meta "
                          f"(the optimizer's settings are recorded)")
    return {**meta, **found}
