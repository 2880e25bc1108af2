"""Print the Nth ```bash block of README.md (1-based) as one command line; with `--out DIR`, the
value of its --out flag replaced by DIR. Used by .ci/run so that CI runs exactly the README's commands."""
import re
import shlex
import sys
from pathlib import Path

blocks = re.findall(r"```bash\n(.*?)```", Path("README.md").read_text(), flags=re.S)
n = int(sys.argv[1])
if len(blocks) < n:
    sys.exit(f"README.md has {len(blocks)} ```bash block(s); CI needs the install+demo and test commands")
command = " ".join(line.rstrip("\\").strip() for line in blocks[n - 1].strip().splitlines())
if len(sys.argv) > 3 and sys.argv[2] == "--out":
    replaced, count = re.subn(r"--out \S+", "--out " + shlex.quote(sys.argv[3]), command)
    if count != 1:
        sys.exit(f"README command {n} has {count} --out flags; expected exactly one: {command}")
    command = replaced
print(command)
