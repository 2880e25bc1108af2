"""The test suite, laid out as the source is (docs/TESTS.md): tests/jaxdp/<package>/ and tests/torch_ref/<package>/
hold a module's tests, tests/<cross-cutting>/ the rest; the shared helpers sit here, importable as `tests.<name>`."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root, from any test's folder
# The suite's XLA:CPU compile setting (the root conftest.py sets it; tests/house/test_compile_flag.py guards it): the
# older fusion emitters, and the kernels' machine code emitted as one LLVM module, compiled on the calling thread
# (the default splits it for a pool of threads, which costs more CPU-seconds on a machine the suite keeps busy)
FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
