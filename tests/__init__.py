"""The test suite, laid out as the source is (docs/TESTS.md): tests/jaxdp/<package>/ and tests/torch_ref/<package>/
hold a module's tests, tests/<cross-cutting>/ the rest; the shared helpers sit here, importable as `tests.<name>`."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root, from any test's folder
# The suite's XLA:CPU compile setting (the root conftest.py sets it; tests/house/test_compile_flag.py guards it)
FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false"
