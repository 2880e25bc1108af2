"""The transformers families of the honest matrix (`hf_honest`): tiny configs, eager attention, no dropout,
nothing downloaded, the same weights every call (seed 0). Each family brings a trap of models as libraries
write them:

  gpt2     fused qkv (Conv1D) with a roundoff-only key bias, head tied to the token embedding
  llama    grouped-query attention, rotary positions, RMSNorm upcast to float32, untied head
  bert     tied decoder weight and bias, embedding rows that never get a gradient
  neox     GPT-NeoX: fused qkv (Linear), partial rotary (a quarter of each head), parallel residual
  resnet   ResNet with BatchNorm (synchronised: `torch_ref.batchnorm.convert_sync_batchnorm`), 16 x 16
           random images, a classification loss
  mistral  sliding-window attention (window 4 < the sequence: the mask cuts the past)
  qwen2    biases on q, k and v only (the key bias gets a roundoff-only gradient: softmax is shift-invariant)
  gemma    (1 + w) RMSNorm with w initialised at 0, GeGLU (tanh GELU), embeddings scaled by sqrt(d), tied head
  phi      partial rotary (half of each head), LayerNorm, biases everywhere, parallel attention and MLP
  opt      learned positions offset by 2 (rows 0 and 1 never get a gradient), ReLU, pre-LayerNorm
  vit      patch embedding (Conv2d), a class token and learned positions, LayerNorm, 16 x 16 images
  falcon   multi-query attention (one key/value head), parallel attention and MLP, one LayerNorm per block
"""
from __future__ import annotations

VOCAB, SEQ, IMAGE, CLASSES = 64, 8, 16, 10
IMAGES = ("resnet", "vit")
PREFIX = {"gpt2": "transformer.", "llama": "model.", "bert": "bert.", "neox": "gpt_neox.", "resnet": "resnet.",
          "mistral": "model.", "qwen2": "model.", "gemma": "model.", "phi": "model.", "opt": "model.decoder.",
          "vit": "vit.", "falcon": "transformer."}
FAMILIES = list(PREFIX)


def _config(hf, name: str):
    """(model class, config) of a family."""
    small = dict(vocab_size=VOCAB, attn_implementation="eager")
    decoder = dict(max_position_embeddings=SEQ, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=32, **small)
    return {
        "gpt2": lambda: (hf.GPT2LMHeadModel, hf.GPT2Config(
            n_positions=SEQ, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            **small)),
        "llama": lambda: (hf.LlamaForCausalLM, hf.LlamaConfig(num_key_value_heads=2, **decoder)),
        "bert": lambda: (hf.BertForMaskedLM, hf.BertConfig(
            max_position_embeddings=2 * SEQ, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **small)),
        "neox": lambda: (hf.GPTNeoXForCausalLM, hf.GPTNeoXConfig(
            max_position_embeddings=SEQ, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, rotary_pct=0.25, hidden_dropout=0.0, attention_dropout=0.0, **small)),
        "resnet": lambda: (hf.ResNetForImageClassification, hf.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
            num_labels=CLASSES)),
        "mistral": lambda: (hf.MistralForCausalLM, hf.MistralConfig(
            num_key_value_heads=2, sliding_window=4, head_dim=4, **decoder)),
        "qwen2": lambda: (hf.Qwen2ForCausalLM, hf.Qwen2Config(num_key_value_heads=2, **decoder)),
        "gemma": lambda: (hf.GemmaForCausalLM, hf.GemmaConfig(num_key_value_heads=1, head_dim=4, **decoder)),
        "phi": lambda: (hf.PhiForCausalLM, hf.PhiConfig(
            partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, **decoder)),
        "opt": lambda: (hf.OPTForCausalLM, hf.OPTConfig(
            max_position_embeddings=SEQ, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, ffn_dim=32,
            word_embed_proj_dim=16, dropout=0.0, attention_dropout=0.0, **small)),
        "vit": lambda: (hf.ViTForImageClassification, hf.ViTConfig(
            image_size=IMAGE, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            num_labels=CLASSES, attn_implementation="eager")),
        "falcon": lambda: (hf.FalconForCausalLM, hf.FalconConfig(
            hidden_size=16, num_hidden_layers=2, num_attention_heads=4, multi_query=True, parallel_attn=True,
            new_decoder_architecture=False, bias=False, hidden_dropout=0.0, attention_dropout=0.0, **small)),
    }[name]()


def hf_model(name: str, dtype: str):
    """A tiny transformers model of family `name` in float64, or float32 (for float32 and bfloat16 runs)."""
    import torch
    import transformers as hf

    from torch_ref import batchnorm

    torch.manual_seed(0)
    cls, config = _config(hf, name)
    model = cls(config)
    if name == "resnet":
        model = batchnorm.convert_sync_batchnorm(model)
    return model.to(torch.float64 if dtype == "float64" else torch.float32)
