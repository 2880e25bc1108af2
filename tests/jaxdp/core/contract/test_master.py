"""The master-dtype rule on hand-made dtypes: silent when the parameters and the optimizer state are held in the
intent's master dtype (or nothing was read), one finding naming each part held otherwise, with its fix; dtype
names from numpy, JAX's HLO and torch read alike."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp.core.contract import master
from jaxdp.core.contract.intent import Intent
from jaxdp.core.errors import ConfigError

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("held,want", [({}, "float32"), ({"parameters": {"float32"}}, "float32"),
                                       ({"parameters": {"float64"}, "optimizer state": {"float64"}}, "float64"),
                                       ({"parameters": {"bfloat16"}}, "bfloat16")])
def test_held_in_the_master_dtype_passes(held, want):
    assert master.findings(held, Intent("ddp", master_dtype=want)) == []


def test_a_bf16_model_is_one_finding_naming_each_part():
    (f,) = master.findings({"parameters": {"bfloat16"}, "optimizer state": {"bfloat16", "float32"}}, Intent("zero3"))
    assert f.kind == "master-dtype"
    assert f.message.startswith("the step updates the parameters in bfloat16 and the optimizer state in bfloat16, "
                                "not float32: each update smaller than half a step"), f.message
    assert "model.to(torch.bfloat16)" in f.fix and "MixedPrecisionPolicy" in f.fix and "--master-dtype" in f.fix


def test_float32_where_float64_was_meant_is_named_without_the_low_precision_reason():
    (f,) = master.findings({"parameters": {"float32"}}, Intent("ddp", master_dtype="float64"))
    assert "float32, not float64" in f.message and "rounds away" not in f.message


@pytest.mark.parametrize("dtype,name", [(np.float32, "float32"), ("f32", "float32"), ("bf16", "bfloat16"),
                                        ("torch.bfloat16", "bfloat16"), ("torch.float16", "float16")])
def test_dtype_names(dtype, name):
    assert master.name(np.dtype(dtype) if dtype is np.float32 else dtype) == name


def test_a_bad_master_dtype_is_one_line():
    with pytest.raises(ConfigError, match="--master-dtype 'fp32' is not a dtype; use one of float32"):
        Intent("ddp", master_dtype="fp32")
