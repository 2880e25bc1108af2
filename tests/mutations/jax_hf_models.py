"""The transformers-config models the catalogue's bugs are planted on in jaxdp: jaxdp's Llama built from a
transformers `Qwen2Config` (q/k/v biases, tied head, rope theta 1e6), `MistralConfig` or `LlamaConfig`
(`torch_ref.models.llama.config_kwargs`, as parity_tests/test_transformers_families.py does), and jaxdp's
GPT-2 from a `GPT2Config` (tied head). Tiny configs, nothing downloaded; the data is the package's text.

`config(family, cfg)`: `cfg` on that model (the sizes the config gives); `built(family)`: a context
manager under which `jaxdp.models.build` builds the config's model (every strategy then trains it).
"""
from __future__ import annotations

import contextlib

from flax import nnx

from jaxdp import models
from jaxdp.core.run import data
from jaxdp.core.run.config import RunConfig

SEQ = 8
LLAMA_SHAPE = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=SEQ, attn_implementation="eager")
# family -> (transformers config class, what it sets beyond the shape)
FAMILIES = {
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True, rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    "mistral": ("MistralConfig", dict(rms_norm_eps=1e-5, sliding_window=None)),
    "llama": ("LlamaConfig", {}),
    "gpt2": ("GPT2Config", dict(n_positions=SEQ, n_embd=16, n_layer=2, n_head=2)),
}
# The run on those models: AdamW with nanoGPT's weight decay, 2 devices, 12 rows of 8 tokens.
RUN = dict(data="text", seq_len=SEQ, batch_size=12, steps=3, seed=3, optimizer="adamw", lr=1e-3, weight_decay=0.1)


def hf_config(family: str):
    import transformers

    name, extra = FAMILIES[family]
    vocab = data.load("text", 0, SEQ).n_classes
    shape = {} if family == "gpt2" else LLAMA_SHAPE
    return getattr(transformers, name)(vocab_size=vocab, **shape, **extra)


def config(family: str, cfg: RunConfig, **run) -> RunConfig:
    """`cfg` (its strategy, devices, accumulation, clip, buckets, replicas) on `family`'s model with `RUN`'s
    optimizer and data, `run` over them."""
    c = hf_config(family)
    if family == "gpt2":
        model = dict(model="gpt2", n_layer=c.n_layer, n_head=c.n_head, d_model=c.n_embd)
    else:
        model = dict(model="llama", n_layer=c.num_hidden_layers, n_head=c.num_attention_heads,
                     n_kv_head=c.num_key_value_heads, d_model=c.hidden_size, d_ff=c.intermediate_size)
    return cfg.replace(**{**RUN, **model, **run})


@contextlib.contextmanager
def built(family: str):
    """`jaxdp.models.build` building `family`'s config's model (gpt2: jaxdp's GPT-2 from the sizes alone)."""
    if family == "gpt2":
        yield
        return
    from torch_ref.models.llama import config_kwargs

    kwargs = config_kwargs(hf_config(family))
    build = models.build

    def from_config(cfg, dataset):
        kw = dict(param_dtype=models.MASTER_DTYPE[cfg.dtype], dtype=models.COMPUTE_DTYPE[cfg.dtype],
                  rngs=nnx.Rngs(cfg.seed), kernels=cfg.kernels)
        return models.Llama(**{**kwargs, "vocab": dataset.n_classes, "seq_len": cfg.seq_len}, **kw)

    models.build = from_config
    try:
        yield
    finally:
        models.build = build
