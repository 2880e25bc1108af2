"""Which flags a run reads: a flag given to a model, strategy or command that does not read it is
refused in one line, never silently ignored (`--hidden` on a gpt, `--bucket-mb` on zero3).

`MODEL_FLAGS` and `STRATEGY_FLAGS` (per framework) name the readers of each flag that only some
models or some strategies read; `check_given` holds the flags a user typed against the runs asked for.
"""
from __future__ import annotations

from .errors import ConfigError

TRANSFORMERS = ("gpt", "gpt2", "llama")
# flag (RunConfig field) -> the models that read it; a flag not listed is read by every model.
MODEL_FLAGS = {
    "hidden": ("mlp",),
    "channels": ("cnn",),
    "batchnorm": ("cnn",),
    "conv_bias": ("cnn",),
    "n_layer": TRANSFORMERS,
    "n_head": TRANSFORMERS,
    "d_model": TRANSFORMERS,
    "seq_len": TRANSFORMERS,
    "n_kv_head": ("llama",),
    "d_ff": ("llama",),
}
DILOCO = {"inner_steps": ("diloco",), "outer_lr": ("diloco",), "outer_momentum": ("diloco",)}
# framework -> flag -> the strategies that read it; a flag not listed is read by every strategy. The
# strategies' own option tables (`jaxdp.strategies.OPTIONS`, `torch_ref.strategies.OPTIONS`) agree with
# it (tests/cli/test_bad_input.py): torch's DDP reads --bucket-mb as bucket_cap_mb, torch has no --collectives.
STRATEGY_FLAGS = {
    "jax": {"bucket_mb": ("ddp-bucket",), "collectives": ("zero1", "zero2", "zero3", "hsdp"),
            "reshard_after_forward": ("zero3", "hsdp"), "replicas": ("hsdp",), "hsdp_hosts": ("hsdp",),
            "axis_type": ("ddp-jit", "zero1-jit", "fsdp-jit"), **DILOCO},
    "torch": {"bucket_mb": ("ddp", "zero1", "ddp-bucket"), "collectives": (),
              "reshard_after_forward": ("zero3", "hsdp"), "replicas": ("hsdp",), "hsdp_hosts": ("hsdp",),
              "axis_type": (), **DILOCO},  # torch runs a -jit name's twin (torch_ref.strategies.TWINS): no axis types
}
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
