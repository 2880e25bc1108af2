"""For the whole test session (tests/, and every process it starts):

- a persistent XLA compilation cache in a fresh temporary folder. Programs compiled once in the
  session (the same step built again by another test, a CLI subprocess, a spawned example, the other
  process of a multi-process run) are then read back instead of compiled again. The folder is new
  for each session, so nothing compiled by an earlier run (or another JAX version) is ever used; set
  JAX_COMPILATION_CACHE_DIR yourself to keep one across sessions. pytest-xdist's workers (two:
  pyproject.toml) start after this file has run in the controlling process, so they inherit its
  environment and share the one folder.
- JAX_DISABLE_MOST_OPTIMIZATIONS=1: XLA's LLVM backend at -O0, no expensive LLVM passes. Compiling
  dominates the suite (hundreds of small steps) and this makes it ~2.5x faster. The HLO passes are
  untouched: by itself it leaves the optimized program the tests read (every collective, its order,
  sizes and loop trips, buffer assignment, `memory_analysis()`) the same text and the same bytes as with
  the defaults (checked for ddp, ddp-bucket and zero3 steps, mlp and gpt2). Only the machine code
  differs, so floats may differ from a default build in their last bits (transcendentals); every
  comparison in the suite is between runs of this one setting (environment variables reach every
  process the tests start). Set JAX_DISABLE_MOST_OPTIMIZATIONS=0 to run the suite on the default
  machine code (slower).
- XLA_FLAGS gets `--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1`
  (`tests.FAST_COMPILE`; jaxlib 0.10, the pinned version, only: another version runs without it): XLA:CPU emits its
  fusions with the older loop emitters, which compile the suite's small steps 2.5x faster (101 programs of three
  ZeRO and DDP runs: 7.4 -> 2.9 CPU-s), and emits their machine code as one LLVM module on the compiling thread
  instead of splitting it for a pool of threads (10-19% fewer CPU-seconds on JAX-bound test files, docs/TESTS.md:
  on 2 busy cores the pool's threads only add work). The second flag changes no HLO. The first changes
  how elementwise work is fused, not what is communicated: tests/house/test_compile_flag.py checks, against a
  process at XLA's defaults, the same collectives in the same order and memory within 1%. The docs' figures
  are measured by the CLI at XLA's defaults. The tests' child processes keep it
  (`jaxdp.core.process.xla_flags`), all but
  the canonical tests' production processes, whose claim is bitwise on the machine code users run."""
import os
import shutil
import tempfile
from importlib.metadata import version

import pytest

from tests import FAST_COMPILE

pytest_plugins = ("tests.host_speed",)  # the summary's line on the host's speed (docs/TESTS.md)

_CREATED = None  # the cache folder this process made (and removes when the session ends)
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CREATED = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxdp-xla-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # every program: the small ones add up
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
if version("jaxlib").startswith("0.10.") and FAST_COMPILE.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()


def pytest_unconfigure(config):
    """The session's cache folder goes with it (only the process that made it: xdist's controller)."""
    if _CREATED:
        shutil.rmtree(_CREATED, ignore_errors=True)


# Files that share tests/torch_helpers.py's per-process torch worlds (`world(n)` runs the selected tests' jobs of
# size n at once, for all of them): one xdist work unit, so the worlds are spawned and run in one worker only.
TORCH_WORLD_FILES = {"tests/jaxdp/models/test_cnn.py", "tests/jaxdp/models/test_gpt2.py",
                     "tests/torch_ref/test_torch_api.py", "tests/torch_ref/test_torch_batchnorm.py",
                     "tests/torch_ref/test_torch_collectives.py", "tests/torch_ref/models/test_torch_shared.py",
                     "tests/torch_ref/strategies/test_torch_strategies.py"}
# The parity suite's files share parity_tests/conftest.py's session caches (`torch_runs()` trains
# every parity configuration's torch side in one world per N; `jax_run`): one unit, so they are computed once.
PARITY_FILES = {f"parity_tests/{name}.py" for name in ("test_cli", "test_parity")}


# The longest units first (their summed durations, measured with --durations), so that no long unit
# starts last on one worker while the other idles: xdist's own order (most tests first) handed out
# test_bench (3 tests, 90 s) and test_multiprocess (80 s) at the end. Units not named: after these.
LONGEST_FIRST = ("torch-worlds", "parity", "tests/jaxdp/canonical/test_canonical.py",
                 "tests/torch_ref/test_hf_models.py", "tests/jaxdp/strategies/zero/test_zero.py",
                 "tests/torch_ref/analysis/test_torch_accounting.py",
                 "tests/torch_ref/test_torch_launch.py", "tests/jaxdp/strategies/zero/test_zero3_compiled.py",
                 "tests/jaxdp/harness/bench/test_bench.py", "tests/jaxdp/test_multiprocess.py",
                 "tests/mutations/test_mutations.py", "parity_tests/test_transformers_families.py",
                 "tests/jaxdp/judge/test_resolution.py", "tests/torch_ref/strategies/test_torch_hsdp8.py",
                 "tests/examples/test_examples.py", "tests/jaxdp/strategies/test_hsdp.py",
                 "tests/torch_ref/test_torch_checkpoint.py", "tests/jaxdp/strategies/jit/test_jit.py",
                 "tests/jaxdp/test_checkpoint.py", "tests/torch_ref/canonical/test_torch_canonical.py",
                 "tests/jaxdp/harness/test_interrupt.py", "tests/cli/test_bad_input.py")


def unit_of(nodeid: str) -> str:
    """The xdist work unit of a test: its file, except the two groups of files that share caches."""
    path = nodeid.split("::", 1)[0]
    if path in TORCH_WORLD_FILES:
        return "torch-worlds"
    return "parity" if path in PARITY_FILES else path


def pytest_collection_modifyitems(config, items):
    """The collection in LONGEST_FIRST's order of units (stable: within a unit, as collected)."""
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` over `unit_of`'s units, handed out in the collection's order (LONGEST_FIRST)."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # xdist's default orders units by their number of tests
    return Scheduling(config, log)
