"""--target --kernels fused: cuDNN's fused attention compiled for an H100 on this CPU machine, with no GPU and no
cuDNN loaded (docs/KERNELS.md, "Compiled for H100s without a GPU"), its calls counted and their FLOPs and bytes
in the projection. One small GPT-2 (1 layer, width 64, 4 heads of 16, 64 tokens) compiled twice, mirrored and
fused; the fallbacks to XLA's attention on one tiny model."""
from __future__ import annotations

import inspect as pyinspect
import json

import pytest

from jaxdp.analysis import aot, gpu_program, hlo, inspect, projection, schedule
from jaxdp.core.run import targets
from jaxdp.core.run.config import RunConfig
from jaxdp.harness import cli

needs_extra = pytest.mark.skipif(not targets.extra_installed(), reason='needs pip install -e ".[gpu-aot]"')
B, H, T, D = 8, 4, 64, 16  # batch, heads, tokens, head dim
GPT2 = RunConfig(model="gpt2", data="text", n_layer=1, n_head=H, d_model=H * D, seq_len=T, devices=1, batch_size=B,
                 dtype="bfloat16", strategy="single")


def _fused_stand_in(monkeypatch):
    """Until the models take `kernels=` (the lead's models/gpt2.py), a fused run's gpt2 attention is
    `attention.fused` here, as the fused model computes it; once they do, this does nothing."""
    import jax.numpy as jnp

    from jaxdp.models import attention, gpt2

    if "kernels" in pyinspect.signature(gpt2.GPT2.__init__).parameters:
        return

    def fused_call(self, x):
        b, t, d = x.shape
        q, k, v = (a.reshape(b, t, self.n_head, d // self.n_head) for a in jnp.split(self.c_attn(x), 3, axis=-1))
        return self.c_proj(attention.fused(q, k, v).reshape(b, t, d))

    monkeypatch.setattr(gpt2.CausalSelfAttention, "__call__", fused_call)


def _inspected(cfg) -> dict:
    step = aot.TargetStep(cfg, "h100", 1)
    return {**inspect.inspect(cfg, step, target="h100"), "program": step.program.as_text()}


@pytest.fixture(scope="module")
def compiled():
    """{"mirrored": inspect's dictionary and its "program" text, "fused": ...}: one compile each for one H100."""
    out = {"mirrored": _inspected(GPT2.validate())}
    with pytest.MonkeyPatch.context() as mp:
        _fused_stand_in(mp)
        out["fused"] = _inspected(GPT2.replace(kernels="fused").validate())
    return out


def _attention_flops(mirrored: dict) -> tuple[float, float]:
    """(the mirrored step's attention matmul FLOPs: Q K^T and P V forward, their 4 gradients' matmuls backward,
    12 b h t^2 d; what cuDNN's causal kernels compute: 4 forward + 10 backward (Q K^T recomputed) per pair of
    the lower triangle, t (t + 1) / 2 of t^2)."""
    full = B * H * T * T * D
    return 12.0 * full, 14.0 * full * (T + 1) / (2 * T)


@needs_extra
def test_the_fused_step_holds_cudnn_attention_forward_and_backward_and_the_mirrored_none(compiled):
    fused, mirrored = compiled["fused"], compiled["mirrored"]
    assert (fused["attention"], fused["fused_attention"]) == ("cudnn", 2)
    assert fused["fused_attention_calls"] == {"forward": 1, "backward": 1}  # one layer: one call each way
    assert (mirrored["attention"], mirrored["fused_attention"]) == ("mirrored", 0)
    assert "attention_note" not in fused and "attention_note" not in mirrored
    lines = gpu_program.format_target(fused).splitlines()
    assert "attention: cudnn, 2 cuDNN fused attention calls (1 forward, 1 backward)" in lines
    assert not any(line.startswith("attention:") for line in gpu_program.format_target(mirrored).splitlines())


@needs_extra
def test_the_projection_counts_the_fused_attentions_flops(compiled):
    """The fused step's matrix FLOPs are the mirrored step's with its attention matmuls replaced by cuDNN's;
    a reader that counts a custom call as nothing (as it did) is 10% short and fails."""
    fused, mirrored = compiled["fused"], compiled["mirrored"]
    xla_attention, cudnn_attention = _attention_flops(mirrored)
    expected = mirrored["step_flops"] - xla_attention + cudnn_attention
    assert fused["step_flops"] == pytest.approx(expected, rel=0.01)
    assert fused["step_flops"] == pytest.approx(mirrored["step_flops"], rel=0.06)  # 65/128 x 14/12 of the attention
    blind = fused["step_flops"] - cudnn_attention  # the custom calls counted as zero
    assert blind != pytest.approx(expected, rel=0.05)


@needs_extra
def test_the_fused_attentions_bytes_are_its_tensors_and_statistics_not_its_score_matrix(compiled):
    text = compiled["fused"]["program"]
    _, comps = hlo.computations(text)
    qkv, stats = B * T * H * D * 2, B * H * T * 4  # bf16 q, k, v, o, dO, their gradients; the f32 log-sum-exp
    found = {}
    for lines in comps.values():
        found_defs = schedule.defs(lines)
        shapes = {n: s for n, s, _, _ in found_defs}
        for _, shape, op, line in found_defs:
            if op == "custom-call" and (target := schedule.fmha_target(line)):
                found[target] = projection._kernel(op, shape, line, shapes, comps, {})
    assert found == {"__cudnn$fmhaSoftmax": 4 * qkv + stats,  # reads q, k, v; writes o, stats
                     "__cudnn$fmhaSoftmaxBackward": 8 * qkv + stats}  # reads q, k, v, o, dO, stats; writes dq, dk, dv


@needs_extra
def test_cudnn_attention_needs_the_version_answer_and_it_is_restored():
    """Without cuDNN loaded, JAX refuses to trace cuDNN attention ("cuDNN not found."); inside
    `aot.cudnn_built_version` it traces with the plugin's build version, and the probe is JAX's own after."""
    import jax
    import jax.numpy as jnp
    from jax._src.cudnn import fused_attention_stablehlo as fmha

    from jaxdp.models import attention

    mesh = aot.topology_mesh("h100", 1, 1)
    one = jax.sharding.SingleDeviceSharding(mesh.devices.flat[0])
    q = jax.ShapeDtypeStruct((1, 8, 2, 8), jnp.bfloat16, sharding=one)
    step = jax.jit(lambda q: attention.fused(q, q, q))
    probe = fmha.check_cudnn_version
    with attention.implementation("cudnn"):
        try:
            probe()
            loaded = True
        except RuntimeError:
            loaded = False
        if not loaded:
            with pytest.raises(RuntimeError, match="cuDNN"):
                step.lower(q)
        with aot.cudnn_built_version():
            text = step.lower(q).compile().as_text()
    assert fmha.check_cudnn_version is probe
    assert schedule.fmha_calls(text) == {"forward": 1, "backward": 0}


def test_float32_or_the_mirrored_kernels_choose_no_cudnn_attention():
    fused = GPT2.replace(kernels="fused")
    assert aot.attention_for(fused) == ("cudnn", "")
    assert aot.attention_for(GPT2) == ("mirrored", "")
    assert aot.attention_for(fused.replace(model="mlp", data="synthetic")) == ("mirrored", "")  # no attention
    kind, note = aot.attention_for(fused.replace(dtype="float32"))
    assert kind == "xla" and note.startswith("--kernels fused --dtype float32: cuDNN's fused attention computes in "
                                             "bf16/fp16 only")


@needs_extra
def test_a_fused_run_cudnn_refuses_compiles_xlas_attention_and_says_so(monkeypatch):
    """A head dim of 4 (cuDNN's must be a multiple of 8): cuDNN refuses it while tracing, and the program has
    XLA's attention, with the refusal in the JSON and a line in the output; never silently."""
    _fused_stand_in(monkeypatch)
    cfg = RunConfig(model="gpt2", data="text", n_layer=1, n_head=4, d_model=16, seq_len=8, devices=1, batch_size=2,
                    dtype="bfloat16", strategy="single", kernels="fused").validate()
    r = inspect.inspect(cfg, target="h100")
    assert (r["attention"], r["fused_attention"]) == ("xla", 0)
    assert "cuDNN's fused attention refused this model (The head dim must be" in r["attention_note"]
    assert f"note: {r['attention_note']}" in gpu_program.format_target(r).splitlines()


# One cuDNN attention call and one cuBLAS GEMM as XLA:GPU prints them (trimmed: no metadata, a shorter config).
FMHA = ('  %fmha = (bf16[2,4,64,16]{3,1,2,0}, f32[2,4,64]{2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), '
        'custom_call_target="__cudnn$fmhaSoftmax", operand_layout_constraints={bf16[2,64,4,16]{3,2,1,0}, '
        'bf16[2,64,4,16]{3,2,1,0}, bf16[2,64,4,16]{3,2,1,0}}, api_version=API_VERSION_STATUS_RETURNING, '
        'backend_config={"cudnn_fmha_backend_config": {"intermediate_tensor_shape": {"element_type": "BF16", '
        '"dimensions": ["2", "4", "64", "64"]}, "mask_type": "CAUSAL", "sliding_window_length": 0}}')
GEMM = """HloModule m

ENTRY %main (a: bf16[2,2304,8192], b: bf16[2,8192,768]) -> (f32[2,2304,768], s8[4194304]) {
  %a = bf16[2,2304,8192]{2,1,0} parameter(0)
  %b = bf16[2,8192,768]{2,1,0} parameter(1)
  ROOT %custom-call.1 = (f32[2,2304,768]{2,1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
}
"""  # noqa: E501


@pytest.mark.parametrize("change, pairs, per_pair", [
    ({}, 64 * 65 // 2, 2 * D),  # causal: the lower triangle; Q K^T and P V
    ({'"CAUSAL"': '"NO_MASK"'}, 64 * 64, 2 * D),
    ({'"sliding_window_length": 0': '"sliding_window_length": 16'}, 16 * 17 // 2 + 48 * 16, 2 * D),
    ({"fmhaSoftmax": "fmhaSoftmaxBackward"}, 64 * 65 // 2, 5 * D)])  # Q K^T again, dV, dP, dQ, dK
def test_a_cudnn_attention_call_counts_its_matmuls_per_pair_it_computes(change, pairs, per_pair):
    line = FMHA
    for old, new in change.items():
        line = line.replace(old, new)
    assert schedule.fmha_flops(line) == 2 * 2 * 4 * pairs * per_pair
    assert schedule.Flops({}).of_line("custom-call", "", line, {}) == schedule.fmha_flops(line)
    assert schedule.fmha_calls(line) == ({"forward": 0, "backward": 1} if "Backward" in line
                                         else {"forward": 1, "backward": 0})


def test_a_cublas_gemm_custom_call_counts_as_its_dot():
    """XLA:GPU hands some GEMMs to cuBLAS as custom calls (GPT-2 124M's fused step: the 12 c_attn weight
    gradients, split in 2 over the 16,384 rows, as __cublas$lt$matmul); they were counted as nothing."""
    assert schedule.total_flops(GEMM) == 2 * 2 * 2304 * 768 * 8192
    assert schedule.total_flops(GEMM.replace("__cublas$", "__other$")) == 0  # any other custom call: no matmul


@needs_extra
def test_memory_target_says_when_fused_has_xlas_attention(capsys, tmp_path):
    path = tmp_path / "rows.json"
    argv = ["memory", "--target", "h100", "--devices", "1", "--strategies", "single", "--model", "gpt2",
            "--data", "text", "--n-layer", "1", "--n-head", "2", "--d-model", "16", "--seq-len", "8",
            "--batch-size", "4", "--kernels", "fused", "--dtype", "float32", "--json", str(path)]
    assert cli.main(argv) == 0
    row = json.loads(path.read_text())[0]
    assert (row["attention"], row["fused_attention"]) == ("xla", 0)
    assert f"note: {row['attention_note']}" in capsys.readouterr().out.splitlines()
