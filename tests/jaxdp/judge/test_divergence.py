"""`jaxdp diff` on traces written by users: the first divergence (step, field, tensor, worst element),
the configuration check on the meta fields both carry, `--json` and `--html`. Synthetic traces,
built as a user's training loop would write them (`trace.save`), no training."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jaxdp.core.traces import trace
from jaxdp.harness import cli
from jaxdp.harness.report import diff_html
from jaxdp.judge import divergence, parity

SHAPES = {"dense/kernel": (3, 4), "dense/bias": (4,), "norm/scale": (4,)}
STATE = {"norm/mean": (4,)}
STEPS = 4
CELLS = len(SHAPES) + len(STATE) + STEPS * (3 + 2 * len(SHAPES) + len(STATE))  # (step, tensor) pairs, init first


def user_trace(dtype=np.float64, **meta) -> trace.Trace:
    """A small model's trace as a user writes it: parameters, gradients, a running mean (state), the
    batch; plain SGD; a meta with only what the user knows."""
    rng = np.random.default_rng(0)
    arrays = {f"init/{n}": rng.standard_normal(s).astype(dtype) for n, s in SHAPES.items()}
    arrays |= {f"state/{n}": np.zeros(s, dtype) for n, s in STATE.items()}
    for k in range(1, STEPS + 1):
        arrays[f"step/{k}/x"] = rng.standard_normal((6, 3)).astype(dtype)
        arrays[f"step/{k}/y"] = rng.integers(0, 4, 6)
        arrays[f"step/{k}/loss"] = np.asarray(2.0 / k)
        for n, s in SHAPES.items():
            before = arrays[f"init/{n}" if k == 1 else f"step/{k - 1}/param/{n}"]
            arrays[f"step/{k}/grad/{n}"] = rng.standard_normal(s).astype(dtype)
            arrays[f"step/{k}/param/{n}"] = (before - 0.1 * arrays[f"step/{k}/grad/{n}"]).astype(dtype)
        for n, s in STATE.items():
            arrays[f"step/{k}/state/{n}"] = (0.9 * arrays.get(f"step/{k - 1}/state/{n}", 0.0)
                                             + rng.standard_normal(s)).astype(dtype)
    return trace.Trace({"framework": "mine", "lr": 0.1, **meta}, arrays)


def planted(t: trace.Trace, key: str, index: tuple, factor: float = 1.5) -> trace.Trace:
    arrays = {k: np.array(v, copy=True) for k, v in t.arrays.items()}
    arrays[key][index] = arrays[key][index] * factor + (1e-3 if key.endswith("loss") else 0.0)
    return trace.Trace(t.meta, arrays)


GOOD = user_trace()

# (key, worst index, expected (step, field, name)): one tensor at one step, one element per field.
BUGS = {
    "grad": ("step/3/grad/dense/kernel", (2, 1), (3, "grad", "dense/kernel")),
    "param": ("step/2/param/dense/bias", (3,), (2, "param", "dense/bias")),
    "state": ("step/4/state/norm/mean", (1,), (4, "state", "norm/mean")),
    "init": ("init/norm/scale", (2,), (0, "init", "norm/scale")),
    "init-state": ("state/norm/mean", (0,), (0, "init", "state/norm/mean")),
    "loss": ("step/2/loss", (), (2, "loss", "loss")),
}


@pytest.mark.parametrize("bug", BUGS)
def test_a_planted_bug_is_the_first_divergence_at_its_step_field_tensor_and_element(bug):
    key, index, where = BUGS[bug]
    if key == "state/norm/mean":  # zeros: a factor leaves them; move the element instead
        bad = trace.Trace(GOOD.meta, {**GOOD.arrays, key: np.where(np.arange(4) == 0, 1e-3, 0.0)})
    else:
        bad = planted(GOOD, key, index)
    report = divergence.compare(bad, GOOD)
    first = report.first
    assert not report.ok and (first.step, first.field, first.name) == where, first
    assert first.index == index and first.key == key
    assert first.a == bad.arrays[key][index] and first.b == GOOD.arrays[key][index]
    assert first.error > first.bound


def test_a_negated_update_under_bounds_that_judge_only_whole_steps_is_named_by_its_tensor():
    """bf16 Adam: per-tensor parameters and updates are not judged (PARITY.md), the step's update is."""
    meta = {**GOOD.meta, "dtype": "bfloat16", "optimizer": "adam"}
    arrays = dict(GOOD.arrays)
    du = GOOD.arrays["step/3/param/dense/kernel"] - GOOD.arrays["step/2/param/dense/kernel"]
    for k in (3, 4):
        arrays[f"step/{k}/param/dense/kernel"] = GOOD.arrays[f"step/{k}/param/dense/kernel"] - 2 * du
    report = divergence.compare(trace.Trace(meta, arrays), trace.Trace(meta, GOOD.arrays))
    first = report.first
    assert (first.step, first.field, first.name, first.measure) == (3, "param", "dense/kernel", "step update")
    assert first.index == np.unravel_index(np.argmax(np.abs(du)), du.shape) and len(report.divergences) == 1


def test_the_earliest_step_wins_and_within_a_step_the_field_order():
    bad = planted(planted(GOOD, "step/3/grad/dense/bias", (0,)), "step/2/param/norm/scale", (1,))
    assert (bad_first := divergence.compare(bad, GOOD).first).step == 2 and bad_first.field == "param"
    both = planted(planted(GOOD, "step/2/param/dense/kernel", (0, 0)), "step/2/grad/norm/scale", (3,))
    first = divergence.compare(both, GOOD).first
    assert (first.field, first.name, first.index) == ("grad", "norm/scale", (3,))


def test_agreeing_traces_have_no_divergence_and_exit_zero(tmp_path, capsys):
    a, b = save(tmp_path, GOOD, user_trace())
    assert cli.main(["diff", a, b, "--json", str(tmp_path / "d.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("first divergence: none") and "ok\n" in out
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["ok"] is True and doc["first_divergence"] is None


def test_the_judge_and_the_first_divergence_agree():
    """`ok` is the judge's verdict (jaxdp.parity.judge), localised: wherever the judge fails on a planted
    bug of a field it judges, the first divergence names it; and a bug below the bounds passes both."""
    for bug in ("grad", "param", "init", "loss"):
        key, index, _ = BUGS[bug]
        bad = planted(GOOD, key, index)
        assert not parity.judge(bad, GOOD, check_config=False).ok and divergence.compare(bad, GOOD).first
    tiny = planted(GOOD, "step/3/grad/dense/kernel", (2, 1), 1 + 1e-15)
    assert parity.judge(tiny, GOOD, check_config=False).ok and divergence.compare(tiny, GOOD).ok


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_is_a_divergence_even_where_both_traces_hold_it(value):
    bad = planted(GOOD, "step/2/grad/dense/kernel", (1, 2), value)
    for a, b in ((bad, GOOD), (bad, bad)):
        report = divergence.compare(a, b)
        assert (report.first.step, report.first.field, report.first.measure) == (2, "grad", "non-finite")
        assert report.first.index == (1, 2) and not report.ok
    assert not divergence.compare(bad, bad, tolerance=1e9).ok


def test_a_key_missing_on_one_side_is_a_divergence_named_by_side():
    lacking = trace.Trace(GOOD.meta, {k: v for k, v in GOOD.arrays.items() if k != "step/2/grad/dense/bias"})
    for a, b, side in ((lacking, GOOD, "a"), (GOOD, lacking, "b")):
        first = divergence.compare(a, b).first
        assert (first.step, first.field, first.name, first.missing) == (2, "grad", "dense/bias", side)
        assert f"step/2/grad/dense/bias is missing in {side.upper()}" in first.describe()
    no_batch = trace.Trace(GOOD.meta, {k: v for k, v in GOOD.arrays.items() if not k.endswith(("/x", "/y"))})
    report = divergence.compare(no_batch, GOOD)  # a recorder's x and y are optional
    assert report.ok and any("batches recorded by one side only" in n for n in report.notes)


def test_a_shorter_trace_and_a_different_shape_are_divergences():
    short = trace.Trace(GOOD.meta, {k: v for k, v in GOOD.arrays.items() if not k.startswith(f"step/{STEPS}/")})
    for (a, b), side in (((short, GOOD), "a"), ((GOOD, short), "b")):
        first = divergence.compare(a, b).first
        assert (first.step, first.field, first.missing) == (STEPS, "loss", side)
    wide = trace.Trace(GOOD.meta, {**GOOD.arrays, "step/2/grad/dense/bias": np.zeros(5)})
    first = divergence.compare(wide, GOOD).first
    assert (first.step, first.field, first.name, first.measure) == (2, "grad", "dense/bias", "shape")
    assert "has shape (5,) in A, (4,) in B" in first.describe()


def test_the_config_check_compares_only_the_fields_both_metas_carry(tmp_path, capsys):
    full = trace.Trace({**GOOD.meta, "model": "mlp", "steps": STEPS, "dtype": "float64", "optimizer": "sgd"},
                       GOOD.arrays)
    a, b = save(tmp_path, full, user_trace())  # the user's meta has lr only: lr is compared
    assert cli.main(["diff", a, b]) == 0
    assert "note: configuration compared on lr\n" in capsys.readouterr().out
    a, b = save(tmp_path, full, user_trace(lr=0.2))
    assert cli.main(["diff", a, b]) == 2
    assert "lr: 0.1 vs 0.2 (compare them anyway with --no-config-check)" in capsys.readouterr().err
    assert cli.main(["diff", a, b, "--no-config-check"]) == 0


def test_unknown_dtype_takes_the_bounds_of_the_arrays_dtype_and_tolerance_overrides():
    f32 = user_trace(np.float32)
    near = planted(f32, "step/2/grad/dense/kernel", (0, 0), 1 + 1e-6)  # float32 noise, far above float64's
    report = divergence.compare(near, f32)
    assert report.ok and report.bounds.dtype == "float32" and report.bounds.measures["grad"] == 1e-5
    assert "dtype float32 from the parameters' arrays" in report.bounds.source
    assert not divergence.compare(near, f32, tolerance=1e-9).ok
    assert divergence.compare(trace.Trace({"dtype": "float64"}, near.arrays), f32).first.field == "grad"


def save(tmp_path, a: trace.Trace, b: trace.Trace) -> tuple[str, str]:
    for name, t in (("a", a), ("b", b)):
        trace.save(tmp_path / f"{name}.npz", t.meta, t.arrays)
    return str(tmp_path / "a.npz"), str(tmp_path / "b.npz")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The grad bug diffed through the CLI once, with --json and --html."""
    out = tmp_path_factory.mktemp("diff")
    a, b = save(out, planted(GOOD, *BUGS["grad"][:2]), GOOD)
    code = cli.main(["diff", a, b, "--json", str(out / "d.json"), "--html", str(out / "d.html")])
    return code, json.loads((out / "d.json").read_text()), (out / "d.html").read_text()


def test_diff_prints_the_first_divergence_first_and_exits_one(written, tmp_path, capsys):
    assert written[0] == 1
    a, b = save(tmp_path, planted(GOOD, *BUGS["grad"][:2]), GOOD)
    cli.main(["diff", a, b])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("first divergence: step 3, grad, dense/kernel at [2, 1]: A ")
    assert "MISMATCH:" in out and "  grad 4.56e-02 > 1e-12 at step/3/grad/dense/kernel" in out


def test_json_holds_the_contract_keys(written):
    _, doc, _ = written
    first = doc["first_divergence"]
    assert doc["ok"] is False
    assert {k: first[k] for k in ("step", "field", "name", "index")} == {
        "step": 3, "field": "grad", "name": "dense/kernel", "index": [2, 1]}
    assert {"a", "b", "error", "bound", "measure"} <= set(first) and first["error"] > first["bound"]
    cells = {(c["step"], c["field"], c["name"]) for c in doc["table"]}
    assert (3, "grad", "dense/kernel") in cells and (0, "init", "state/norm/mean") in cells
    assert len(cells) == len(doc["table"]) == CELLS


def test_html_is_one_self_contained_page_with_the_heatmap_and_the_step_table(written):
    _, _, page = written
    assert page.startswith("<!DOCTYPE html>") and "http://" not in page.replace('xmlns="http://www.w3.org', "")
    assert "<script" not in page and "<link" not in page and "<img" not in page
    assert '<svg xmlns="http://www.w3.org/2000/svg"' in page and 'id="heatmap"' in page
    assert page.count("<rect") == CELLS + 1 and 'id="first"' in page  # a cell per (step, tensor)
    assert 'id="first-divergence">step 3, grad, dense/kernel at [2, 1]' in page
    table = page[page.index('id="step-table"'):]
    assert '<tr class="first"><td>grad</td><td class="name">dense/kernel</td>' in table
    assert table.count("<tr") == 1 + 3 + 2 * len(SHAPES) + len(STATE)  # the header and step 3's tensors


def test_a_bad_tolerance_or_unwritable_output_is_one_line(tmp_path, capsys):
    a, b = save(tmp_path, GOOD, GOOD)
    assert cli.main(["diff", a, b, "--tolerance", "-1"]) == 2
    assert "--tolerance -1.0: must be a finite number >= 0" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert cli.main(["diff", a, b, "--json", str(tmp_path / "file" / "d.json")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_html_renders_in_headless_chromium_with_the_first_divergence_outlined(written, tmp_path):
    """Optional (as tests/jaxdp/harness/report/test_compare.py): the page draws, and the outline of the first divergence
    (#1565c0) and a cell beyond its bound (red) are on screen."""
    import os
    import shutil
    import subprocess

    from matplotlib.image import imread

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Debian's chromium is not installed on this machine (.ci/run installs it for CI)")
    page, shot = tmp_path / "d.html", tmp_path / "shot.png"
    page.write_text(written[2])
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=900,1100", f"--screenshot={shot}",
                    f"file://{os.path.abspath(page)}"], capture_output=True, timeout=120)
    pixels = (imread(shot)[..., :3] * 255).round().astype(int)

    def count(hex_colour):
        return int((pixels == [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]).all(-1).sum())

    assert count("#1565c0") > 40 and count(diff_html.colour(1e3)) > 50


@pytest.mark.parametrize("key, index", [("init/norm/scale", (2,)), ("step/2/x", (1, 1))])
def test_an_exact_check_that_failed_is_never_called_identical(key, index, tmp_path, capsys):
    """The initial parameters and batches must be bitwise equal: a failed one said '(identical error 5.00e-01,
    identical)'; it says by how much it differs, and no line of the MISMATCH says 'identical'."""
    a, b = save(tmp_path, planted(GOOD, key, index, factor=2.0), GOOD)
    assert cli.main(["diff", a, b]) == 1
    out = capsys.readouterr().out
    assert "where it must be bitwise equal)" in out.splitlines()[0], out
    assert "identical" not in out, out
