"""Which flags a run reads: a flag given to a model, strategy or command that does not read it is
refused in one line, never silently ignored (`--hidden` on a gpt, `--bucket-mb` on zero3).

`MODEL_FLAGS` and `STRATEGY_FLAGS` (per framework) name the readers of each flag that only some
models or some strategies read; `check_given` holds the flags a user typed against the runs asked for.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..registry import models, strategies

TRANSFORMERS = models.names(transformer=True)
# flag (RunConfig field) -> the models that read it (their registry rows' `flags`); a flag not listed is read
# by every model.
MODEL_FLAGS = {flag: models.readers(flag) for e in models.ENTRIES for flag in e.flags}
# framework -> flag -> the strategies that read it (their registry rows' options); a flag not listed is read by
# every strategy. The strategies' own option tables (`jaxdp.strategies.OPTIONS`, `torch_ref.strategies.OPTIONS`)
# read the same rows: torch's DDP reads --bucket-mb as bucket_cap_mb, torch has no --collectives and runs a
# -jit name's twin (no axis types).
OPTION_FLAGS = ("bucket_mb", "collectives", "reshard_after_forward", "replicas", "hsdp_hosts", "axis_type",
                "inner_steps", "outer_lr", "outer_momentum")
STRATEGY_FLAGS = {f: {flag: strategies.readers(f, flag) for flag in OPTION_FLAGS} for f in ("jax", "torch")}
PACKAGE = {"jax": "jaxdp", "torch": "torch_ref"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_given(given, model: str, runs, reduction: str = "native") -> None:
    """Refuse a typed flag that `model`, every (framework, strategy) of `runs` or the `reduction` leaves unread."""
    runs = list(runs)
    for name in sorted(given):
        readers = MODEL_FLAGS.get(name)
        if readers and model not in readers:
            raise ConfigError(f"{_flag(name)} is read only by --model {' or '.join(readers)}, not {model}: "
                              f"drop {_flag(name)}")
        if name in STRATEGY_FLAGS["jax"] and not any(s in STRATEGY_FLAGS[f][name] for f, s in runs):
            frameworks = sorted({f for f, _ in runs})
            same = len({STRATEGY_FLAGS[f][name] for f in frameworks}) == 1
            readers = [", ".join(STRATEGY_FLAGS[f][name]) + ("" if same else f" in {PACKAGE[f]}")
                       for f in frameworks[:1 if same else None] if STRATEGY_FLAGS[f][name]]
            if not readers:  # no strategy of these frameworks reads it: say who does
                raise ConfigError(f"{_flag(name)} is read only by jaxdp's --strategy "
                                  f"{', '.join(STRATEGY_FLAGS['jax'][name])}; {PACKAGE[frameworks[0]]} has no such "
                                  f"choice: drop {_flag(name)}")
            raise ConfigError(f"{_flag(name)} is read only by --strategy " + "; ".join(readers) + ", not "
                              f"{', '.join(dict.fromkeys(s for _, s in runs))}: drop {_flag(name)}")
        if name == "shards" and reduction != "canonical":
            raise ConfigError("--shards is read only by --reduction canonical: drop --shards or add "
                              "--reduction canonical")
