"""The walk from a strategy's canonical path (default zero2): the jaxdp modules ("rooms") whose
functions run while its canonical gradient is traced (sys.setprofile over `accounting.compile_step`,
a 1-layer GPT on 2 devices), the calls from one room to another ("moves"), and those that run back up
a floor. Floors, bottom to top: 0 jaxdp.core; 1 the base (devices, collectives, optim, models); 2
canonical; 3 the strategies' shared floor (strategies.common, grads, finite, stats); 4 a strategy's own
files. A move from floor f to a floor above runs back up one, as does a move from one strategy's files
to another's (zero/ is one); each is an import arrow (the caller imports the callee, as
tests/house/test_house.py reads imports) or a callback (a function handed down, called back).

    python .ci/walk.py [strategy]
"""
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = {"jaxdp.strategies", "jaxdp.strategies.common", "jaxdp.strategies.grads", "jaxdp.strategies.finite",
          "jaxdp.strategies.stats"}
ENTRY = {"canonical_grads", "grads_of", "sync", "canonical_sync"}  # the strategy's canonical functions


def floor(m: str) -> int:
    if m.startswith("jaxdp.core"):
        return 0
    if m.startswith("jaxdp.canonical"):
        return 2
    if m in SHARED:
        return 3
    return 4 if m.startswith("jaxdp.strategies") else 1


def walk(strategy: str) -> Counter:
    import jaxdp

    jaxdp.setup_devices(2, reduction="canonical")
    from jaxdp.analysis import accounting
    from jaxdp.core.run.config import RunConfig
    from jaxdp.strategies.zero import layout

    module = f"jaxdp.strategies.zero.{strategy}" if strategy in layout.LAYOUTS else f"jaxdp.strategies.{strategy}"
    calls, stack, inside = Counter(), [], [0]

    def name(frame):
        return frame.f_globals.get("__name__", "")

    def profile(frame, event, arg):
        if event == "call":
            enter = name(frame) == module and frame.f_code.co_name in ENTRY
            stack.append(enter)
            inside[0] += enter
            caller = name(frame.f_back) if frame.f_back else ""
            if inside[0] and caller.startswith("jaxdp") and name(frame).startswith("jaxdp") and caller != name(frame):
                calls[caller, name(frame)] += 1
        elif event == "return" and stack:
            inside[0] -= stack.pop()

    cfg = RunConfig(strategy=strategy, devices=2, model="gpt", data="text", n_layer=1, d_model=16, n_head=2,
                    seq_len=8, batch_size=8, reduction="canonical", steps=1, dtype="float32")
    sys.setprofile(profile)
    try:
        accounting.compile_step(cfg)
    finally:
        sys.setprofile(None)
    return calls


def main(argv: list[str]) -> int:
    from tests.test_house import graph

    edges = graph()

    def imports(a, b):  # directly, or through b's package (its __init__ re-exports)
        return b in edges.get(a, ()) or any(b.startswith(p + ".") for p in edges.get(a, ()) if p.startswith("jaxdp"))

    def family(m):
        return ".".join(m.split(".")[:3])

    calls = walk(argv[0] if argv else "zero2")
    up = {(a, b) for a, b in calls if floor(b) > floor(a) or (floor(a) == floor(b) == 4 and family(a) != family(b))}
    rooms = sorted({m for pair in calls for m in pair})
    print(f"rooms {len(rooms)}: " + ", ".join(f"{m} ({floor(m)})" for m in rooms))
    print(f"moves {len(calls)}")
    for a, b in sorted(calls):
        print(f"  {a} -> {b}" + (f"   back up: {'import' if imports(a, b) else 'callback'}" if (a, b) in up else ""))
    print(f"back up a floor {len(up)}, of which import arrows {sum(imports(a, b) for a, b in up)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
