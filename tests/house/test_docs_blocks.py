"""The docs' command blocks run as written, in order: every file a block reads (`jaxdp diff A B`'s traces,
`--resume`'s checkpoint folder, a `load("...")` in an inline script) is written by a command before it in the
same page (`--trace`, `--json`, `--html`, `--out`, `--checkpoint-dir`, `{strategy}` expanded over
`--strategy`). Checked statically: running every block would take the suite's time; what the check reads is
the one way a block fails before it starts (TORCH_REF.md diffed a `jax_run.npz` no block wrote)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests import REPO

PAGES = sorted(Path(REPO, "docs").glob("*.md")) + [Path(REPO, "README.md")]
SHELL = ("bash", "sh", "shell", "console", "")  # a fence's language; a bare fence may hold commands too
WRITES = ("--trace", "--json", "--html", "--out", "--checkpoint-dir")
LOADS = re.compile(r"""load\(\s*["']([^"']+)["']""")


def commands(page: str) -> list[str]:
    """The shell lines of the page's command blocks, in order, continuations joined."""
    out, lang = [], None  # lang: the open fence's language, None outside a block
    for line in page.replace("\\\n", " ").splitlines():
        fence = line.strip().startswith("```")
        if fence:
            lang = line.strip()[3:].strip() if lang is None else None
        elif lang in SHELL and line.strip():
            out.append(line.strip())
    return out


def _flag(words: list[str], name: str) -> str | None:
    for i, w in enumerate(words):
        if w == name and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(name + "="):
            return w.split("=", 1)[1]
    return None


def unwritten(lines: list[str]) -> list[str]:
    """'line: path' for every input a line reads that no line before it writes."""
    written, missing = set(), []
    for line in lines:
        try:
            words = shlex.split(line.split(" #")[0])
        except ValueError:  # not shell (a heredoc's Python, a listing)
            words = line.split()
        reads = LOADS.findall(line)
        if words[:2] == ["jaxdp", "diff"]:
            reads += [w for w in words[2:4] if not w.startswith("-")]
        if "--resume" in words and _flag(words, "--checkpoint-dir"):
            reads.append(_flag(words, "--checkpoint-dir"))
        inside = {p for p in reads for w in written if p.startswith(w + "/")}  # a file of a written --out folder
        missing += [f"{line}: {p}" for p in reads if p not in written | inside]
        strategies = (_flag(words, "--strategy") or _flag(words, "--strategies") or "").split(",")
        for flag in WRITES:
            if (path := _flag(words, flag)) is not None:
                written |= {path.replace("{strategy}", s) for s in strategies}
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_a_block_reads_is_written_before_it(page):
    assert not unwritten(commands(page.read_text())), f"{page.name}: read before any block writes it"


def test_the_check_sees_a_file_no_block_writes():
    page = ("```bash\njaxdp train --strategy ddp,zero3 --trace 'runs/{strategy}.npz'\n"
            "jaxdp diff runs/zero3.npz runs/ddp.npz\n```\n"
            "```bash\npython -m torch_ref train --trace run.npz\njaxdp diff run.npz jax_run.npz --tolerance 1e-5\n"
            "jaxdp train --checkpoint-dir ck --resume\n"
            "python - <<'PY'\nnp.load(\"one.npz\")\nPY\n```\n")
    assert unwritten(commands(page)) == ["jaxdp diff run.npz jax_run.npz --tolerance 1e-5: jax_run.npz",
                                         "jaxdp train --checkpoint-dir ck --resume: ck",
                                         'np.load("one.npz"): one.npz']
