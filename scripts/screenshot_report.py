"""Regenerate docs/compare_screenshot.png: run a small `jaxdp compare` (both frameworks), write its report,
and render report.html in headless Chromium (Debian's `chromium`) to a PNG.

    PYTHONPATH=$PWD python scripts/screenshot_report.py            # docs/compare_screenshot.png (README's run)
    PYTHONPATH=$PWD python scripts/screenshot_report.py --out /tmp/shot.png --strategies ddp,zero1,zero3

Also imported by tests/jaxdp/harness/report/test_compare.py (`browser`, `chromium_flags`, `dom_status`, `screenshot`).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUS = re.compile(r'<div id="status" hidden="">images (\d+)/(\d+), tables (\d+) rows</div>')


def browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium_flags(profile_dir: str) -> list[str]:
    """Headless, offline, with a throwaway profile; 5 s of virtual time for the page's load script."""
    return [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile_dir}", "--virtual-time-budget=5000", "--hide-scrollbars"]


def dom_status(html_path: str, profile_dir: str) -> tuple[tuple[int, int, int] | None, str]:
    """((images decoded, images, table rows) as the page counts them on load, or None if it did not; the DOM)."""
    url = "file://" + os.path.abspath(html_path)
    dom = subprocess.run(chromium_flags(profile_dir) + ["--dump-dom", url], capture_output=True, text=True,
                         timeout=120).stdout
    found = STATUS.search(dom)
    return (tuple(map(int, found.groups())) if found else None), dom


README_SIZE = "1200,1250"  # the page's top: the title, "Which strategy", the verdict and the first figure


def screenshot(html_path: str, png: str, profile_dir: str, size: str = "1200,2600") -> str:
    url = "file://" + os.path.abspath(html_path)
    subprocess.run(chromium_flags(profile_dir) + [f"--window-size={size}", f"--screenshot={os.path.abspath(png)}",
                                                  url], capture_output=True, timeout=120, check=True)
    return png


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "compare_screenshot.png"))
    parser.add_argument("--strategies", default="ddp,ddp-ring,zero1,zero3")  # the README's first command's run
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    if browser() is None:
        print("chromium is not installed (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    from jaxdp import devices
    from jaxdp.core.run.config import RunConfig
    from jaxdp.harness.report import render, runner

    cfg = RunConfig(model="mlp", data="synthetic", devices=args.devices, steps=args.steps, dtype="float32")
    devices.setup(cfg.devices, cfg.platform)  # simulated CPU devices, before JAX starts (as `jaxdp compare`)
    work = tempfile.mkdtemp(prefix="jaxdp-screenshot-")
    summary = runner.compare(cfg, args.strategies.split(","), progress=lambda m: print(m, flush=True))
    paths = render.write(summary, os.path.join(work, "report"))
    status, _ = dom_status(paths["html"], os.path.join(work, "profile"))
    print(f"page: images {status[0]}/{status[1]}, {status[2]} table rows" if status else "page: no status line")
    screenshot(paths["html"], args.out, os.path.join(work, "profile"), size=README_SIZE)
    print(f"screenshot: {args.out} (report: {paths['html']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
