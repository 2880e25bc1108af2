"""`jaxdp check --framework torch FILE.py:FUNCTION --devices N`: a gloo CPU world of N ranks
(`torch_ref.launch`: every rank dies with its parent, the world has a timeout), in which every rank imports
FILE.py, calls FUNCTION(rank, world) for `(step, args, model, optimizer)` (the user's wrapped model, its
optimizer, a step and its inputs) and runs the step once under `torch_ref.check`; rank 0's report comes back."""
from __future__ import annotations

from torch import nn

from jaxdp.core.contract import user
from jaxdp.core.errors import ConfigError, RunFailed

from .check import check

SHAPE = ("it must return (step, args, model, optimizer): a step callable as step(*args), a tuple of its inputs, "
         "the wrapped nn.Module (DDP, fully_shard) and its optimizer (or None)")


def built(step: str, value) -> tuple:
    """FUNCTION's `value`, checked to be (step, args, model, optimizer); ConfigError naming the shape if not."""
    if not (isinstance(value, tuple) and len(value) == 4 and callable(value[0]) and isinstance(value[1], tuple)
            and isinstance(value[2], nn.Module) and (value[3] is None or hasattr(value[3], "param_groups"))):
        raise ConfigError(f"{step} returned {type(value).__name__}; {SHAPE}")
    return value


def rank_check(rank: int, world: int, where: str, name: str, want: dict):
    """On every rank: FUNCTION(rank, world)'s step checked; rank 0 returns (the report's text, its dict)."""
    step = f"{where}:{name}"
    fn = user.load(where, name)
    try:
        value = fn(rank, world)
    except Exception as e:
        raise RunFailed(f"{step}: {type(e).__name__}: {e}") from e
    run, args, model, optimizer = built(step, value)
    report = check(run, *args, model=model, optimizer=optimizer, **want)
    return (report.to_text(), report.to_dict()) if rank == 0 else None


def run(where: str, name: str, devices: int, want: dict, timeout_s: float) -> tuple[str, dict]:
    """Rank 0's (text, report dict) from a world of `devices` ranks; ConfigError for a FUNCTION that returns
    the wrong thing, RunFailed for one that raises, a rank that fails, or a world past `timeout_s`."""
    from ..launch import RankError, launch

    try:
        return launch(rank_check, devices, where, name, want, platform="cpu", timeout_s=timeout_s,
                      pg_timeout_s=min(120.0, timeout_s))[0]
    except RankError as e:
        if isinstance(e.cause, (ConfigError, RunFailed)):
            raise type(e.cause)(str(e.cause)) from None
        raise RunFailed(f"{where}:{name}: {e}") from None
    except TimeoutError as e:
        raise RunFailed(f"{where}:{name}: {e}") from None
