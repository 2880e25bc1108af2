"""`--json -` writes the document to stdout, in every command that has `--json` (`memory`, `inspect`, `diff`):
stdout is then the document alone (the command's text goes to stderr), so that `... --json - | jq` reads it,
and no file named `-` is made. Several strategies would write several documents: refused in one line."""
from __future__ import annotations

import json
import os

import pytest

from jaxdp.core.traces import trace
from jaxdp.harness import cli
from tests.jaxdp.judge.test_error_model import run

SMALL = ["--strategies", "ddp", "--devices", "2", "--hidden", "8,8", "--batch-size", "8"]


def _traces(tmp_path) -> list[str]:
    paths = [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]
    for p, seed in zip(paths, (1, 2), strict=True):
        t = run(run_seed=seed)
        trace.save(p, t.meta, t.arrays)
    return paths


@pytest.mark.parametrize("command", ["memory", "inspect", "diff"])
def test_json_dash_is_the_document_on_stdout(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["diff", *_traces(tmp_path), "--no-config-check"] if command == "diff" else [command, *SMALL]
    code = cli.main([*argv, "--json", "-"])
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    doc = json.loads(out)  # the whole of stdout
    assert doc and not os.path.exists("-")
    assert err  # the table, the summary or the verdict: on stderr
    if command == "diff":
        assert doc["ok"] is True


def test_json_dash_with_several_strategies_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["inspect", *SMALL[:1], "ddp,zero3", *SMALL[2:], "--json", "-"]) == 2
    assert capsys.readouterr().err == ("jaxdp: error: --json - writes one document to stdout; several strategies "
                                       "write several: give one --strategy, or a path with {strategy} in it, e.g. "
                                       "--json {strategy}.json\n")
