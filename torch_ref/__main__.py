import sys

from .cli import main

if __name__ == "__main__":  # guarded: spawned ranks import the parent's __main__ module
    sys.exit(main())
