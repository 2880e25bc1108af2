"""Adam with coupled weight decay, its decayed gradient g + wd p rounded apart where m and v read it
(jaxdp/judge/decay_split.py): a run that does so (as XLA:CPU's older fusion emitters at -O0 do) passes the
judge, and fails it without that allowance; a learning rate off by 1e-12 still fails. float64, jaxdp's single
on the mlp, one step: its parameters recomputed in numpy, m from the twice-rounded sum, v from the once-rounded."""
import numpy as np

from jaxdp.core.traces import trace
from jaxdp.judge import decay_split, parity
from tests.conftest import BASE, run
from tests.helpers import as_trace

CFG = BASE.replace(strategy="single", devices=1, optimizer="adam", steps=1)  # float64, lr 0.05, weight decay 0.01
B1, B2, EPS = 0.9, 0.999, 1e-8


def split_step(t: trace.Trace, lr_factor: float = 1.0) -> trace.Trace:
    arrays, wd = dict(t.arrays), CFG.weight_decay
    for name in t.names():
        p, g = t.arrays[f"init/{name}"], t.arrays[f"step/1/grad/{name}"]
        twice = g + wd * p
        once = (g.astype(np.longdouble) + np.longdouble(wd) * p.astype(np.longdouble)).astype(np.float64)
        m_hat = ((1 - B1) * twice) / (1 - B1)
        v_hat = ((1 - B2) * once * once) / (1 - B2)
        arrays[f"step/1/param/{name}"] = p + (-CFG.lr * lr_factor) * (m_hat / (np.sqrt(v_hat) + EPS))
    return trace.Trace(t.meta, arrays)


def honest() -> trace.Trace:
    return as_trace(run(CFG))


def test_the_copies_differ_where_decay_cancels_the_gradient():
    t = honest()
    p, g = t.arrays["init/layers/0/kernel"], t.arrays["step/1/grad/layers/0/kernel"]
    after = t.arrays["step/1/param/layers/0/kernel"]
    moved = split_step(t).arrays["step/1/param/layers/0/kernel"] - after
    ulps = np.abs(moved) / np.spacing(np.maximum(abs(p), abs(after)))
    worst = np.unravel_index(np.argmax(ulps), p.shape)
    cancel = (np.abs(g) + CFG.weight_decay * np.abs(p)) / np.abs(g + CFG.weight_decay * p)
    assert ulps[worst] >= 8 and cancel[worst] > 50, (ulps[worst], cancel[worst])


def test_an_honest_split_passes_and_fails_without_its_allowance(monkeypatch):
    t = honest()
    assert parity.judge(split_step(t), t, check_config=False).ok
    monkeypatch.setattr(decay_split, "envelope", lambda *a: {})
    row = parity.judge(split_step(t), t, check_config=False)
    assert not row.ok and any(f.startswith("resolved element") for f in row.failures), row.failures


def test_a_learning_rate_off_by_1e_12_still_fails():
    t = honest()
    row = parity.judge(split_step(t, lr_factor=1 + 1e-12), t, check_config=False)
    assert not row.ok, row.failures
