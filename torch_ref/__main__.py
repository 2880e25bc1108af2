"""`python -m torch_ref train`: the torch side from the command line. An entry point, not a module of the
library: it trains from the JAX side's initial parameters, so it runs through jaxdp's harness
(jaxdp/harness/torch_cli.py); `import torch_ref` loads no JAX."""
import sys

from jaxdp.harness.torch_cli import main

if __name__ == "__main__":  # guarded: spawned ranks import the parent's __main__ module
    sys.exit(main())
