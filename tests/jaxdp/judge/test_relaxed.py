"""The error model's explanation of an allowance (jaxdp/judge/relaxed.py `why`) says only what is true: an
element whose two sides' gradients give the same replayed update gets nothing "from the gradients", and
its allowance is named for what it is (one ulp of storage); where the replay does differ, the text says by
how much, and only then names the optimizer's amplification."""
from __future__ import annotations

import pytest

from jaxdp.judge.error_model import Optimizer
from jaxdp.judge.relaxed import why

ADAMW = Optimizer("adamw", 1e-3, 0.1)
ULP = 1.2e-7  # ulp(1) in float32: a LayerNorm scale's storage


@pytest.mark.quick
def test_equal_gradients_get_no_explanation_from_them():
    text = why(ADAMW, 0.25, 0.25, 1.0, ULP, 1.1e-7, ("A", "B"), stored=ULP)
    assert "bitwise equal" in text and "nothing is allowed from the gradients" in text
    assert "one ulp of the stored parameter" in text and f"{ULP:.1e}" in text
    assert "amplifies" not in text and "differ by" not in text and "roundoff level" not in text


@pytest.mark.quick
def test_different_gradients_are_named_with_the_difference_they_make():
    text = why(ADAMW, 3e-20, -6e-21, 2.6e-2, 3.4e-15 + 2e-19, 3.4e-15, ("A", "B"), stored=2e-19)
    assert "make this element's updates differ by 3.4e-15" in text and "amplifies" in text
    assert "plus one ulp of storage 2.0e-19" in text and "bitwise equal" not in text
    assert "nothing is allowed" not in text


@pytest.mark.quick
def test_equal_gradients_at_this_step_say_where_the_difference_comes_from():
    """m and v carry earlier steps' gradients, and AdamW's decay the parameters: equal gradients at step k may
    still replay to different updates; the text then says so instead of crediting this step's gradients."""
    text = why(ADAMW, 0.5, 0.5, 1.0, 2e-9 + ULP, 2e-9, ("A", "B"), stored=ULP)
    assert "equal at this step: from earlier steps' gradients or the parameters" in text


@pytest.mark.quick
def test_a_parameter_measure_has_no_storage_part():
    assert "allowed: nothing" in why(ADAMW, 1.0, 1.0, 1.0, 0.0, 0.0)
