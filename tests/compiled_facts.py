"""What the suite's checks read from a compiled step, for tests/house/test_compile_flag.py: every collective in program
order (with the times it runs per step) and `memory_analysis()`'s figures, as JSON.

    python -m tests.compiled_facts CONFIGS.json    # a list of RunConfig fields; prints a list of facts
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def facts(fields: dict) -> dict:
    from jaxdp.analysis import accounting, hlo
    from jaxdp.core.run.config import RunConfig

    cfg = RunConfig(**fields)
    program = accounting.compile_step(cfg).program
    text = program.as_text()
    return {"collectives": hlo.collectives_in_order(text, cfg.devices), "memory": accounting.step_memory(program),
            "lines": len(text.splitlines())}


def main(argv) -> None:
    from jaxdp import devices

    configs = json.loads(Path(argv[0]).read_text())
    devices.setup(max(c["devices"] for c in configs), "cpu")
    print(json.dumps([facts(c) for c in configs]))


if __name__ == "__main__":
    main(sys.argv[1:])
