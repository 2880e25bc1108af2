"""The house's rules, read from the source (AST; imports inside functions count): no import cycle among
jaxdp's and torch_ref's modules; `jaxdp.core` imports neither jax, flax, optax nor torch; torch_ref takes
only `jaxdp.core` from jaxdp; only `jaxdp.harness` imports torch_ref. And, run: `import torch_ref` loads
no JAX, and jaxdp trains with torch absent.

Entry scripts (`__main__.py`) are no module of the graph: nothing imports them. `torch_ref/__main__.py`
(`python -m torch_ref train`) runs through jaxdp's harness, because its runs start from the JAX side's
initial parameters (jaxdp/harness/torch_run.py)."""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

from tests import REPO

ROOT = Path(REPO)
PACKAGES = ("jaxdp", "torch_ref")
FRAMEWORKS = ("jax", "jaxlib", "flax", "optax", "orbax", "torch")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, me: str, modules: set[str]) -> set[str]:
    """Every module that `path` (module `me`) imports: ours resolved to the deepest module of the tree,
    others as written; imports inside functions included."""
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return found


@functools.cache
def graph() -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if p.name != "__main__.py"]
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported(p, module_name(p), modules) for p in paths}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_core_imports_no_framework():
    bad = {m: sorted(i for i in imps if any(within(i, f) for f in FRAMEWORKS + ("torch_ref",)))
           for m, imps in graph().items() if within(m, "jaxdp.core")}
    assert {m: b for m, b in bad.items() if b} == {}


def test_torch_ref_takes_only_the_core_from_jaxdp():
    bad = {m: sorted(i for i in imps if within(i, "jaxdp") and not within(i, "jaxdp.core"))
           for m, imps in graph().items() if within(m, "torch_ref")}
    assert {m: b for m, b in bad.items() if b} == {}


def test_only_the_harness_imports_torch_ref():
    bad = [m for m, imps in graph().items() if within(m, "jaxdp") and not within(m, "jaxdp.harness")
           and any(within(i, "torch_ref") for i in imps)]
    assert bad == []


def test_the_checker_sees_a_cycle_and_a_deferred_import(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from torch_ref import train\n    from . import x\n")
    assert imported(src, "jaxdp.m", {"torch_ref.train", "jaxdp.x"}) == {"torch_ref.train", "jaxdp.x"}


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_import_torch_ref_loads_no_jax():
    loaded = run_python("import sys, torch_ref, torch_ref.api, torch_ref.train, torch_ref.trace, torch_ref.convert; "
                        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax')))")
    assert loaded.strip() == "[]"


def test_jaxdp_trains_without_torch():
    """torch made unimportable (as if not installed): `jaxdp.train.run` trains two devices of ddp."""
    out = run_python(
        "import sys; sys.modules['torch'] = None\n"
        "import jaxdp; jaxdp.setup_devices(2)\n"
        "from jaxdp import train\n"
        "from jaxdp.core.run.config import RunConfig\n"
        "r = train.run(RunConfig(strategy='ddp', devices=2, steps=2, hidden=(8,), batch_size=8))\n"
        "print(len(r.losses), 'torch' in sys.modules and sys.modules['torch'] is not None)")
    assert out.split()[-2:] == ["2", "False"]


def test_the_layout_map_lists_every_module():
    """docs/LAYOUT.md's map (generated by .ci/layout.py) lists every module of jaxdp/ and torch_ref/ as it is."""
    done = subprocess.run([sys.executable, ".ci/layout.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_no_import_hook_and_the_documented_paths_are_plain_modules():
    """`import jaxdp` leaves `sys.meta_path` as it was (no finder keeps old paths alive); the three paths
    the docs give users are plain modules re-exporting the names they promise, and the mutations'
    command runs at its own path."""
    out = run_python(
        "import sys; before = list(sys.meta_path)\n"
        "import jaxdp, jaxdp.core\n"
        "print(sys.meta_path == before)\n"
        "from jaxdp.trace import Recorder, Trace, TraceError, diff, load, save\n"
        "from jaxdp.parity import judge\n"
        "from jaxdp.divergence import Report, compare\n"
        "import jaxdp.judge.parity as harness\n"
        "print(Recorder.__module__, judge is harness.judge, jaxdp.trace.__spec__.name)\n"
        "import importlib.util\n"
        "print(importlib.util.find_spec('jaxdp.mutations'), importlib.util.find_spec('jaxdp.bench'))")
    assert out.split() == ["True", "jaxdp.core.traces.recorder", "True", "jaxdp.trace", "None", "None"]
    done = subprocess.run([sys.executable, "-m", "tests.mutations", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m tests.mutations"), done.stderr


# The twin rule (docs/STRATEGIES.md, "same names"): every module of these jaxdp packages has its torch_ref twin
# at the same relative path, or is listed here with the reason it has none.
TWINNED = ("models", "analysis", "canonical", "strategies")
NO_TWIN = {
    "models/unit_vjp.py": "one jax.custom_vjp per unit keeps XLA's compiled schedule; FSDP2's hooks run it eagerly",
    "canonical/compiler.py": "chooses XLA's compiler options for canonical programs; torch runs no compiler",
    "models/dot_fold.py": "fixes the weight gradients' layout in canonical's per-shard program, as XLA's simplifier "
                          "would; torch's autograd computes the weight gradient in its layout",
    "models/cast_once.py": "bf16 weights cast once per step for a pure loss; torch's cast is a forward on bf16 copies "
                           "or FSDP2's MixedPrecisionPolicy, built with the model in torch_ref/kernels.py",
    "models/loop_conv.py": "a convolution backward XLA:CPU runs with Eigen inside a loop body; torch has no compiler",
    "analysis/hlo.py": "reads XLA's compiled program; torch has none (analysis/profiler.py reads what ran)",
    "analysis/inspect.py": "`jaxdp inspect` prints the compiled program's collectives; torch has no compiled program",
    "analysis/aot.py": "XLA compiles for a GPU it does not have; torch's side is docs/GPU.md's part 5 (fake tensors)",
    "analysis/gpu_program.py": "reads XLA:GPU's scheduled program (async pairs); torch has no compiled program",
    "analysis/schedule.py": "XLA:GPU's latency-hiding schedule, read from its HLO; torch has none",
    "analysis/target_memory.py": "XLA:GPU's compiled peak for a target; torch's is docs/GPU.md's part 5",
    "analysis/projection.py": "a step time projected from XLA:GPU's compiled program; torch has none to read",
    "analysis/fusion_reads.py": "what a fused XLA:GPU kernel reads, for the projection; torch has no fused program",
    "analysis/kernels.py": "XLA:GPU's compiled kernels by kind, for the projection; torch has no compiled program",
    "analysis/calibration.py": "the calibrated projection of XLA:GPU's compiled program; torch has none to read",
    "analysis/calibration_points.py": "the projection's calibration table, of JAX programs compiled for GPUs",
    "analysis/network.py": "the cluster's network for the projection of a compiled JAX program",
    "analysis/program_cache.py": "XLA:GPU target programs kept on disk; torch compiles none for a target",
    "analysis/widened.py": "the bf16 reductions XLA:CPU runs widened, read from its HLO; torch has no compiled program",
    "strategies/ddp_pmap.py": "pmap is JAX's own form of DDP",
    "strategies/diloco_reference.py": "diloco's one-process oracle, written once: both frameworks' runs are tested "
                                      "against it",
    "strategies/grads.py": "local gradients with accumulation: torch's are strategies/common.py:local_grads (no_sync)",
    "strategies/stats.py": "BatchNorm's running statistics through a functional step; torch's modules keep them",
    "strategies/jit/__init__.py": "sharding annotations for XLA's partitioner: torch has no compiler partitioner",
    "strategies/jit/ddp.py": "XLA's partitioner (ddp-jit)",
    "strategies/jit/fsdp.py": "XLA's partitioner (fsdp-jit)",
    "strategies/jit/layout.py": "XLA's partitioner (the -jit layouts)",
    "strategies/jit/step.py": "XLA's partitioner (the -jit step)",
    "strategies/jit/zero1.py": "XLA's partitioner (zero1-jit)",
    "strategies/zero/fsdp.py": "zero3's gather and reduce-scatter by unit: PyTorch's fully_shard does it",
}


def relative_modules(package: str) -> set[str]:
    return {p.relative_to(ROOT / package).as_posix() for folder in TWINNED
            for p in (ROOT / package / folder).rglob("*.py")}


def test_every_jax_module_has_its_torch_twin_at_the_same_path_or_a_reason():
    jax_side, torch_side = relative_modules("jaxdp"), relative_modules("torch_ref")
    missing = sorted(jax_side - torch_side - set(NO_TWIN))
    assert not missing, f"no torch_ref twin and no reason in NO_TWIN: {missing}"
    stale = sorted(set(NO_TWIN) - (jax_side - torch_side))
    assert not stale, f"NO_TWIN lists modules that are gone or now have a twin: {stale}"


def test_every_module_is_under_300_lines():
    """The house's size rule (DESIGN.md: one idea per file), held for every module of both packages."""
    long = {str(p.relative_to(ROOT)): n for pkg in ("jaxdp", "torch_ref") for p in Path(ROOT, pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) >= 300}
    assert not long, f"modules of 300 lines or more (split them by idea): {long}"
