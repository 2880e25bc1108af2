"""Reference models for the scaling projection: published transformer shapes, with the parameter
count and the training FLOPs per token computed from those shapes (not copied from a table).

Parameters (decoder-only transformer, per layer): attention q and o are d x d, k and v are d x kv
with kv = n_kv_head x d / n_head (grouped-query attention when n_kv_head < n_head); the FFN has two
d x d_ff matrices, or three with a gated (SwiGLU) FFN; two norms per layer (LayerNorm: scale and
bias, RMSNorm: scale) and one final norm; GPT-2 also has a bias on every linear layer and learned
positions; embeddings are tied (GPT-2) or a separate LM head (Llama 3).

Training FLOPs per token: 6 N + 12 L d T (PaLM, Chowdhery et al. 2022, appendix B; the same as
nanoGPT's `estimate_mfu`): 2 FLOPs per parameter per token forward and 4 backward, plus the
attention scores and their weighted sum, 2 x 2 L T d forward, times 3 for backward. N counts every
parameter, the input embedding too (a lookup, not a matmul: 6.5% of Llama 3 8B's parameters), and the
score matrix is counted whole, as PaLM does (a causal kernel skips about half of it).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transformer:
    name: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    d_ff: int
    vocab: int
    context: int            # T: tokens per sequence, the published training context
    gated_ffn: bool         # SwiGLU: gate, up and down matrices
    biases: bool            # biases on every linear layer and LayerNorm (scale + bias) instead of RMSNorm
    tied_embeddings: bool   # the LM head reuses the token embedding
    learned_positions: bool
    batch_seqs: int         # global batch, in sequences of `context` tokens (see `source`)
    published_params: float
    source: str


GPT2_124M = Transformer(
    name="GPT-2 124M", n_layer=12, d_model=768, n_head=12, n_kv_head=12, d_ff=4 * 768, vocab=50257, context=1024,
    gated_ffn=False, biases=True, tied_embeddings=True, learned_positions=True, batch_seqs=512,
    published_params=124e6,
    source=("Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners' (GPT-2 paper): smallest "
            "model 12 layers, d_model 768, context 1024, vocabulary 50,257, batch 512 sequences; Hugging Face "
            "config of 'gpt2': n_layer 12, n_embd 768, n_head 12, n_positions 1024, tied LM head; 124M parameters."),
)

LLAMA3_8B = Transformer(
    name="Llama 3 8B", n_layer=32, d_model=4096, n_head=32, n_kv_head=8, d_ff=14336, vocab=128256, context=8192,
    gated_ffn=True, biases=False, tied_embeddings=False, learned_positions=False, batch_seqs=512,
    published_params=8.03e9,
    source=("Meta, Llama 3 model card (8B: 8k context, grouped-query attention, 8.03B parameters) and the config of "
            "'Meta-Llama-3-8B': 32 layers, hidden 4096, 32 heads, 8 KV heads, intermediate 14336, vocabulary "
            "128,256, untied LM head, RMSNorm, SwiGLU. Meta publishes no batch size for 8B: 512 x 8192 = 4M tokens "
            "is the batch of the Llama 2 paper (Touvron et al. 2023, all sizes)."),
)

REFERENCES = (GPT2_124M, LLAMA3_8B)


def of_run(cfg, vocab: int) -> Transformer:
    """The shape of a run's `--model gpt2` or `--model llama` (its vocabulary from the dataset), so that
    `params` and `flops_per_token` count a run as they count the references (tests/jaxdp/models/test_llama.py checks
    `params` against the models' own parameters)."""
    if cfg.model not in ("gpt2", "llama"):
        raise ValueError(f"of_run counts --model gpt2 or llama, not {cfg.model!r}")
    llama = cfg.model == "llama"
    return Transformer(
        name=f"{cfg.model} (this run)", n_layer=cfg.n_layer, d_model=cfg.d_model, n_head=cfg.n_head,
        n_kv_head=cfg.kv_heads() if llama else cfg.n_head, d_ff=cfg.ffn_width() if llama else 4 * cfg.d_model,
        vocab=vocab, context=cfg.seq_len, gated_ffn=llama, biases=not llama, tied_embeddings=not llama,
        learned_positions=not llama, batch_seqs=cfg.batch_size, published_params=0.0, source="--model " + cfg.model)


def params(m: Transformer) -> int:
    """Parameter count from the shapes (module docstring)."""
    d, kv = m.d_model, m.n_kv_head * (m.d_model // m.n_head)
    norm = 2 * d if m.biases else d
    per_layer = 2 * d * d + 2 * d * kv + (3 if m.gated_ffn else 2) * d * m.d_ff + 2 * norm
    if m.biases:
        per_layer += (d + 2 * kv) + d + m.d_ff + d  # qkv, attention out, FFN up, FFN down
    embeddings = m.vocab * d * (1 if m.tied_embeddings else 2) + (m.context * d if m.learned_positions else 0)
    return m.n_layer * per_layer + embeddings + norm


def flops_per_token(m: Transformer) -> float:
    """Training FLOPs per token: 6 N + 12 L d T (module docstring)."""
    return 6.0 * params(m) + 12.0 * m.n_layer * m.d_model * m.context
