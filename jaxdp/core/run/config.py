"""One run configuration, shared by `jaxdp train`, `python -m torch_ref train` and every report.
`RunConfig` is the single definition of the flags: `jaxdp.core.run.argv` builds the argparse flags from
its fields and reads them back, so the two frameworks can never drift apart; `values.RULES` holds
the range of every number, checked by `validate` for the command line and the library alike.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass, field

from .. import registry
from ..errors import ConfigError
from . import diloco_options, values
from .hsdp_hosts import HOSTS
from .kernels import KERNELS, check_compile
from .kernels import check as check_kernels
from .reduction import REDUCTIONS, resolve_shards

MODELS = registry.models.names()
TOKEN_DATA = ("tokens", "llama3-tokens")  # made token ids (jaxdp/core/run/data.py): vocabulary 50304, 128256
DATASETS = ("synthetic", "digits", "text", *TOKEN_DATA)
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
DTYPES = ("float64", "float32", "bfloat16")
BATCHNORMS = ("sync", "local")
PLATFORMS = ("auto", "cpu", "gpu")
COLLECTIVES = ("xla", "ring")
# Strategy names per framework, from the registry (jaxdp/core/registry/strategies.py): a name means the same
# algorithm on both sides; torch runs a -jit name's same-layout twin.
JIT_STRATEGIES, AXIS_TYPES = registry.strategies.names(comm="jit"), ("auto", "explicit")  # jaxdp/strategies/jit/
FRAMEWORK_STRATEGIES = {f: registry.strategies.names(f) for f in ("jax", "torch")}
ALL_STRATEGIES = tuple(dict.fromkeys(FRAMEWORK_STRATEGIES["jax"] + FRAMEWORK_STRATEGIES["torch"]))
ALIASES = registry.strategies.ALIASES
# --preset: sets these fields (over their flags); gpt2-124m is GPT-2 small on the package's token data.
# llama3-8b: Llama 3 8B's shapes (vocabulary 128256, GQA 32/8 heads, SwiGLU 14336) at a 2048-token context.
PRESETS = {"gpt2-124m": dict(model="gpt2", data="tokens", n_layer=12, n_head=12, d_model=768, seq_len=1024),
           "llama3-8b": dict(model="llama", data="llama3-tokens", n_layer=32, n_head=32, n_kv_head=8, d_model=4096,
                             d_ff=14336, seq_len=2048)}
PACKAGE = {"jax": "jaxdp", "torch": "torch_ref"}


def require_torch(command: str) -> None:
    """`command` runs torch_ref: say in one line how to install PyTorch when it is missing."""
    if importlib.util.find_spec("torch") is None:  # asked, not imported: the core loads no framework
        raise ConfigError(
            f"{command} needs PyTorch, which is not installed: pip install -c constraints-cpu.txt -e '.[torch]' "
            f"(in a clone of jaxdp), or pip install 'jaxdp[torch]'"
        )


def llama_d_ff(d_model: int, multiple_of: int = 256) -> int:
    """Meta's reference SwiGLU width: int(2 x 4 d_model / 3) rounded up to a multiple of 256 (11008 at 4096)."""
    hidden = int(2 * 4 * d_model / 3)
    return multiple_of * -(-hidden // multiple_of)


def _flag(default, help, choices=None, type=None):
    return field(default=default, metadata={"help": help, "choices": choices, "type": type})


@dataclass(frozen=True)
class RunConfig:
    model: str = _flag("mlp", "model architecture", MODELS)
    data: str = _flag("synthetic", "dataset (gpt needs text)", DATASETS)
    strategy: str = _flag(registry.strategies.DEFAULT, "data-parallel strategy (fsdp is an alias of zero3)",
                          ALL_STRATEGIES + tuple(ALIASES))
    devices: int = _flag(1, "number of devices (simulated CPU devices when no accelerator)")
    platform: str = _flag("auto", "device platform; cpu simulates --devices CPU devices", PLATFORMS)
    steps: int = _flag(20, "optimizer steps")
    batch_size: int = _flag(64, "global batch of one optimizer step (all devices, all micro-batches)")
    accum: int = _flag(1, "gradient-accumulation micro-batches per step (one sync per step)")
    optimizer: str = _flag("adamw", "optimizer (torch.optim semantics)", OPTIMIZERS)
    lr: float = _flag(1e-3, "learning rate")
    weight_decay: float = _flag(0.0, "weight decay: coupled (L2 in the gradient) for sgd/momentum/adam, decoupled "
                                "for adamw")
    clip_norm: float = _flag(0.0, "clip the global gradient norm to this value as torch's clip_grad_norm_ (0: off)")
    dtype: str = _flag("float32", "float64, float32, or bfloat16 (bf16 compute, fp32 master params, reduction and "
                       "optimizer state)", DTYPES)
    seed: int = _flag(0, "seed for parameters and data")
    hidden: tuple = _flag((64, 64), "mlp hidden widths, comma separated", type=values.int_list)
    channels: tuple = _flag((8, 16), "cnn: output channels of its two 3x3 convolutions, comma separated",
                            type=values.int_list)
    batchnorm: str = _flag(
        "sync", "cnn: BatchNorm statistics under data parallelism: sync (over the global micro-batch, every "
        "strategy equals single) or local (each device its own rows, torch DDP's default; rank 0's running "
        "statistics)", BATCHNORMS)
    conv_bias: bool = _flag(
        False, "cnn: a bias in each convolution, before its BatchNorm (as many models write it; the mean "
        "subtraction cancels it, so its gradient is roundoff only)", type=values.bool_text)
    bucket_mb: float = _flag(25.0, "ddp-bucket: bucket capacity in MB (2**20 bytes)")
    n_layer: int = _flag(2, "gpt, gpt2, llama: transformer blocks")
    n_head: int = _flag(2, "gpt, gpt2, llama: attention heads")
    n_kv_head: int = _flag(0, "llama: key/value heads of grouped-query attention, dividing --n-head (0: --n-head)")
    d_model: int = _flag(32, "gpt, gpt2, llama: embedding width")
    d_ff: int = _flag(0, "llama: SwiGLU hidden width (0: Meta's rule, int(8 d_model / 3) rounded up to a multiple "
                      "of 256: 11008 at d_model 4096)")
    seq_len: int = _flag(32, "gpt, gpt2, llama: context length in tokens")
    preset: str = _flag("", "gpt2-124m: GPT-2 small (12 layers, 12 heads, width 768, context 1024, vocabulary "
                        "50304) on --data tokens; llama3-8b: Llama 3 8B (32 layers, 32/8 heads, width 4096, SwiGLU "
                        "14336, vocabulary 128256, context 2048) on --data llama3-tokens, for --target; sets --model, "
                        "--data and those sizes", tuple(PRESETS))
    collectives: str = _flag("xla", "zero1/2/3: XLA's built-in collectives or the explicit ring", COLLECTIVES)
    reshard_after_forward: bool = _flag(
        True, "zero3 (FSDP2's name): true frees each unit's gathered parameters after its forward and gathers "
        "them again for backward (3 x (N-1)/N Psi sent); false keeps them until backward (2 x, more memory)",
        type=values.bool_text)
    replicas: int = _flag(1, "hsdp: R groups of --devices / R devices, zero3 within a group, replicated across")
    hsdp_hosts: str = _flag("shard", "hsdp, several processes: each process (host) holds whole shard groups (the "
                            "gathers stay in a host) or whole replica groups (docs/STRATEGIES.md)", HOSTS)
    inner_steps: int = _flag(diloco_options.DEFAULTS["inner_steps"], "diloco: K local steps between outer steps")
    outer_lr: float = _flag(diloco_options.DEFAULTS["outer_lr"], "diloco: the outer SGD's learning rate")
    outer_momentum: float = _flag(diloco_options.DEFAULTS["outer_momentum"], "diloco: outer Nesterov momentum")
    axis_type: str = _flag("auto", "-jit strategies: the mesh's jax.sharding.AxisType (docs/STRATEGIES.md)", AXIS_TYPES)
    reduction: str = _flag(
        "native", "gradient reduction: native (each N sums in its own order) or canonical (the same bits on any "
        "N dividing --shards: docs/CANONICAL.md)", REDUCTIONS)
    shards: int = _flag(
        0, "canonical: shards per micro-batch, a power of two that --devices divides; S is the largest N you will "
        "compare (0: the largest power of two dividing batch/accum, at most 64, that keeps >= 64 rows or >= 512 "
        "tokens per shard)")
    kernels: str = _flag("mirrored", "mirrored (the twins' op-for-op code, the reference) or fused (each framework "
                         "as its users run it: fused attention, bf16 weights cast once, fused optimizers: "
                         "docs/KERNELS.md)", KERNELS)
    compile: bool = _flag(False, "torch_ref: torch.compile the model (jaxdp's step is always compiled by XLA)")
    nan_check: bool = _flag(True, "stop with the step and tensor on a NaN or Inf loss, gradient or parameter")
    checkpoint_dir: str = _flag("", "directory for checkpoints (orbax in jaxdp, torch.distributed.checkpoint in "
                                "torch_ref)")
    checkpoint_every: int = _flag(0, "save a checkpoint every K steps (0: never)")
    resume: bool = _flag(False, "resume from the latest complete checkpoint in --checkpoint-dir")
    overwrite_checkpoints: bool = _flag(False, "start over in a --checkpoint-dir holding an earlier run's "
                                        "checkpoints: delete them (only what a jaxdp or torch_ref run wrote)")

    def __post_init__(self):
        if self.strategy in ALIASES:
            object.__setattr__(self, "strategy", ALIASES[self.strategy])
        if self.preset in PRESETS:  # applied once, then cleared: a later replace(n_layer=...) is not undone
            for name, value in PRESETS[self.preset].items():
                object.__setattr__(self, name, value)
            object.__setattr__(self, "preset", "")

    # ---- validation -------------------------------------------------------------------------
    def validate(self, framework: str = "jax") -> RunConfig:
        """Check the configuration for `framework` ('jax' or 'torch'); raise ConfigError naming the fix."""
        values.check_ranges({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        for name, valid in (("model", MODELS), ("data", DATASETS), ("optimizer", OPTIMIZERS), ("dtype", DTYPES),
                            ("platform", PLATFORMS), ("collectives", COLLECTIVES), ("batchnorm", BATCHNORMS),
                            ("hsdp_hosts", HOSTS), ("axis_type", AXIS_TYPES)):
            value = getattr(self, name)
            if value not in valid:
                raise ConfigError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")
        here = FRAMEWORK_STRATEGIES[framework]
        if self.strategy not in ALL_STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; valid: {', '.join(here)}")
        if self.strategy not in here:
            owners = " and ".join(PACKAGE[f] for f, names in FRAMEWORK_STRATEGIES.items() if self.strategy in names)
            raise ConfigError(
                f"strategy {self.strategy!r} exists only in {owners}; {PACKAGE[framework]} has: {', '.join(here)}"
            )
        if registry.strategies.on_one_device(self.strategy) and self.devices != 1:
            raise ConfigError(f"strategy {self.strategy!r} runs on one device; got --devices {self.devices} "
                              f"(use --devices 1)")
        per = self.devices * self.accum
        if self.batch_size % per:
            lo = max(per, self.batch_size - self.batch_size % per)
            rows = self.batch_size // self.accum if self.batch_size % self.accum == 0 else 0
            fewer = f", or --devices {math.gcd(self.devices, rows)}" if per > self.batch_size and rows else ""
            raise ConfigError(
                f"--batch-size {self.batch_size} does not divide by devices x accum = "
                f"{self.devices} x {self.accum} = {per}; valid sizes near it: {lo}, {lo + per}{fewer}"
            )
        if self.model == "gpt" and self.data != "text":
            raise ConfigError("model 'gpt' trains on characters: use --data text")
        if self.preset and self.preset not in PRESETS:
            raise ConfigError(f"unknown preset {self.preset!r}; valid: {', '.join(PRESETS)}")
        if self.model in ("gpt2", "llama") and self.data not in ("text", *TOKEN_DATA):
            raise ConfigError(f"model {self.model!r} trains on tokens: use --data text or --data tokens")
        if self.data in TOKEN_DATA and self.model not in ("gpt2", "llama"):
            own = {"gpt": "text", "cnn": "digits"}.get(self.model, "synthetic")
            raise ConfigError(f"data {self.data!r} (token ids) is for --model gpt2 or llama; use --data {own} "
                              f"for {self.model}")
        if self.model == "mlp" and self.data == "text":
            raise ConfigError("data 'text' is for --model gpt; use --data synthetic or digits for mlp")
        self._validate_transformer()
        if self.model == "cnn" and self.data != "digits":
            raise ConfigError("model 'cnn' trains on 8x8 images: use --data digits")
        if len(self.channels) != 2:
            raise ConfigError(f"--channels takes two widths (conv1,conv2), got {len(self.channels)}; e.g. 8,16")
        if (self.resume or self.checkpoint_every > 0) and not self.checkpoint_dir:
            raise ConfigError("--resume and --checkpoint-every need --checkpoint-dir DIR")
        if self.overwrite_checkpoints and (self.resume or self.checkpoint_every <= 0):
            raise ConfigError("--overwrite-checkpoints starts a saving run over: give --checkpoint-every K, and "
                              "drop --resume (which continues from the checkpoints instead)")
        self._validate_replicas(framework)
        diloco_options.check(self)
        if self.axis_type != "auto" and self.strategy not in JIT_STRATEGIES:
            raise ConfigError(f"--axis-type is for {', '.join(JIT_STRATEGIES)}, not {self.strategy}: drop it")
        self._validate_reduction()
        check_kernels(self.kernels, self.reduction, self.dtype)
        check_compile(self.compile, self.reduction)
        self._validate_jax_strategy(framework)
        return self

    def _validate_jax_strategy(self, framework: str) -> None:
        """What jaxdp's strategy builders refuse, said here before any work (`jaxdp bench` planned a
        -jit strategy on the cnn and failed after 313 s): the -jit ones and hsdp run no BatchNorm, and
        the -jit ones have the native reduction only."""
        if framework != "jax":
            return
        if self.model == "cnn" and not registry.strategies.get(self.strategy, "batchnorm", True):
            raise ConfigError(f"strategy {self.strategy!r} runs no model with running statistics (BatchNorm, "
                              f"--model cnn): use ddp, zero1 or zero3")
        runs = registry.strategies.get(self.strategy, "reductions", REDUCTIONS)  # its row's reductions
        if self.reduction not in runs:
            why = " (the partitioner orders the sums)" if self.strategy in JIT_STRATEGIES else ""
            raise ConfigError(f"strategy {self.strategy!r} has --reduction {' or '.join(runs)} only{why}: use ddp, "
                              f"zero1 or zero3 for {self.reduction}")

    def _validate_transformer(self) -> None:
        """gpt, gpt2, llama: the heads divide the width; llama's own flags (and only llama's)."""
        if self.model in ("gpt", "gpt2", "llama") and (self.n_head < 1 or self.d_model % self.n_head):
            raise ConfigError(f"--d-model {self.d_model} must divide by --n-head {self.n_head}")
        for name in ("n_kv_head", "d_ff"):
            flag, value = "--" + name.replace("_", "-"), getattr(self, name)
            if value and self.model != "llama":
                raise ConfigError(f"{flag} is for --model llama (got --model {self.model}); leave it at 0")
            if value < 0:
                raise ConfigError(f"{flag} must be positive, or 0 for its default; got {value}")
        if self.model != "llama":
            return
        if self.n_head % self.kv_heads():
            raise ConfigError(f"--n-kv-head {self.n_kv_head} must divide --n-head {self.n_head} "
                              f"(grouped-query attention): e.g. --n-kv-head 1 or {self.n_head}")
        if (self.d_model // self.n_head) % 2:
            raise ConfigError(f"llama's head dimension --d-model / --n-head = {self.d_model // self.n_head} must "
                              f"be even (rotary embeddings rotate pairs): e.g. --d-model {2 * self.d_model}")

    def _validate_replicas(self, framework: str) -> None:
        """--replicas: only with hsdp, dividing --devices; hsdp runs no BatchNorm model."""
        n, r, hsdp = self.devices, self.replicas, registry.strategies.get(self.strategy, "grid", False)
        if r != 1 and not hsdp:
            raise ConfigError(f"--replicas {r} is for --strategy hsdp, not {self.strategy}: drop --replicas")
        if self.hsdp_hosts != "shard" and not hsdp:
            raise ConfigError(f"--hsdp-hosts {self.hsdp_hosts} is for --strategy hsdp, not {self.strategy}")
        if hsdp and (r < 1 or n % r):
            raise ConfigError(f"--replicas {r} must divide --devices {n}: give one of "
                              + ", ".join(str(d) for d in range(1, n + 1) if n % d == 0))
        if hsdp and self.model == "cnn":
            raise ConfigError("--strategy hsdp has no --model cnn (BatchNorm); use --strategy zero3")

    def kv_heads(self) -> int:
        """llama's key/value heads: --n-kv-head, or --n-head when it is 0."""
        return self.n_kv_head or self.n_head

    def ffn_width(self) -> int:
        """llama's SwiGLU hidden width: --d-ff, or Meta's rule when it is 0 (`llama_d_ff`)."""
        return self.d_ff or llama_d_ff(self.d_model)

    def tokens_per_row(self) -> int:
        """Tokens in one row of a batch: the context length for the token data, else 1 (canonical's S)."""
        return self.seq_len if self.data in ("text", *TOKEN_DATA) else 1

    def _validate_reduction(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ConfigError(f"unknown reduction {self.reduction!r}; valid: {', '.join(REDUCTIONS)}")
        if self.reduction == "native":
            if self.shards:
                raise ConfigError("--shards is for --reduction canonical")
            return
        resolve_shards(self.shards, self.batch_size // self.accum, self.devices, self.tokens_per_row())
        if self.model == "cnn" and self.batchnorm == "local":
            raise ConfigError("--reduction canonical needs --batchnorm sync: local statistics are per device, so "
                              "they depend on N (or use --reduction native)")

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        d["channels"] = list(self.channels)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        if "hidden" in d:
            d["hidden"] = tuple(d["hidden"])
        if "channels" in d:
            d["channels"] = tuple(d["channels"])
        return cls(**d)


# Fields that define *what* is computed; two traces are comparable when these agree.
COMPARABLE_FIELDS = (
    "model", "data", "steps", "batch_size", "accum", "optimizer", "lr", "weight_decay", "clip_norm", "dtype", "seed",
    "hidden", "channels", "batchnorm", "conv_bias", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "seq_len",
)
