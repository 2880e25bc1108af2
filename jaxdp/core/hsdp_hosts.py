"""hsdp's flags across commands and hosts (no framework imported).

- `per_strategy`: commands that take several strategies (`jaxdp compare`, `memory`, `parity`, `train
  --strategy a,b`) apply `--replicas` to the hsdp entries only; every other entry runs with replicas 1.
  `--replicas` given while no listed strategy is hsdp is refused in one line.
- `one_group`: hsdp at `--replicas 1` (one group) is zero3; the train commands say so in one line.
- `--hsdp-hosts shard|replica`: which whole groups of the R x S grid each process (host) holds in a
  multi-process run. `shard` (the default, the usual layout): each host holds whole shard groups (grid
  rows), so the all-gathers and reduce-scatters stay inside a host and only the all-reduce of Psi / S
  across groups crosses hosts; with R = processes, one replica per host. `replica`: each host holds whole
  replica groups (grid columns): the cross-group all-reduce stays inside a host, the gathers cross.
  The devices are process-major (process p holds devices [p N/P, (p+1) N/P)), so `shard` fills the grid
  row-major and `replica` column-major (`grid_order`); `check_hosts` says before any work whether P
  processes can hold whole groups of the asked kind (P divides R for `shard`, S for `replica`).
"""
from __future__ import annotations

from .errors import ConfigError
from .registry import strategies as registry

HOSTS = ("shard", "replica")


def _grid(name: str) -> bool:
    """Strategy `name` runs over a grid of --replicas groups (its registry row's `grid`: hsdp)."""
    return registry.get(name, "grid", False)


def per_strategy(cfg, name: str):
    """`cfg` for one listed strategy: `--replicas` (and `--hsdp-hosts`) kept for hsdp only, `--axis-type` for the
    -jit strategies only (`config.JIT_STRATEGIES`, named by their suffix here: config imports this module)."""
    axis = {} if name.endswith("-jit") else {"axis_type": "auto"}
    if _grid(name):
        return cfg.replace(strategy=name, **axis)
    return cfg.replace(strategy=name, replicas=1, hsdp_hosts="shard", **axis)


def one_group(cfg) -> str | None:
    """The note `jaxdp train` and `torch_ref train` print (stderr) for hsdp with one group: it is zero3."""
    if not _grid(cfg.strategy) or cfg.replicas != 1 or cfg.devices == 1:
        return None
    return (f"hsdp with --replicas 1 is one group of all {cfg.devices} devices: that is zero3 (for R replica "
            f"groups give --replicas R, R > 1 dividing --devices)")


def check_listed(replicas: int, names, flag: str = "--strategies", hosts: str = "shard") -> None:
    """`--replicas R` (R != 1) and `--hsdp-hosts replica` are for hsdp: refuse them when none of `names` is."""
    names = list(names)
    if any(map(_grid, names)):
        return
    if replicas != 1 and len(names) == 1:  # as the configuration says it (`RunConfig.validate`)
        raise ConfigError(f"--replicas {replicas} is for --strategy hsdp, not {names[0]}: drop --replicas")
    if replicas != 1:
        raise ConfigError(f"--replicas {replicas} is for hsdp, which {flag} {','.join(names)} does not list: "
                          f"add hsdp to {flag} or drop --replicas")
    if hosts != "shard":
        raise ConfigError(f"--hsdp-hosts {hosts} is for hsdp, which {flag} {','.join(names)} does not list: "
                          f"add hsdp to {flag} or drop --hsdp-hosts")


def check_hosts(devices: int, replicas: int, processes: int, hosts: str, flag: str = "--processes") -> None:
    """P processes (hosts; `flag` names their count: torch_ref's is torchrun's --nnodes) each hold whole
    groups of the kind `hosts` asks for, or one line naming the flags."""
    if hosts not in HOSTS:
        raise ConfigError(f"unknown --hsdp-hosts {hosts!r}; valid: {', '.join(HOSTS)}")
    if processes <= 1:
        return
    shards = devices // replicas
    count, what = (replicas, "shard groups (rows)") if hosts == "shard" else (shards, "replica groups (columns)")
    if count % processes:
        other = "replica" if hosts == "shard" else "shard"
        raise ConfigError(
            f"--hsdp-hosts {hosts}: {flag} {processes} cannot each hold whole {what} of the "
            f"--replicas {replicas} x {shards} grid ({count} of them): give {flag} dividing {count}, or "
            f"--replicas {'a multiple of' if hosts == 'shard' else 'dividing --devices by a multiple of'} "
            f"{processes}, or --hsdp-hosts {other}")


def grid_order(devices: int, replicas: int, hosts: str) -> list[list[int]]:
    """The grid as indices into the process-major device list: row r (a shard group), column s (a replica
    group). `shard`: row r = [r S, (r+1) S); `replica`: column s = [s R, (s+1) R)."""
    shards = devices // replicas
    if hosts == "replica":
        return [[s * replicas + r for s in range(shards)] for r in range(replicas)]
    return [[r * shards + s for s in range(shards)] for r in range(replicas)]
