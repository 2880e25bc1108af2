"""The same jaxdp step compiled for the GPU in hand and ahead of time for an H100 topology with no device
(`jax.experimental.topologies`, docs/BENCHMARKS.md "On a real GPU"): collectives, memory_analysis() peak,
cost_analysis() FLOPs and bytes, the roofline projection against the measured step time. One JSON line.

    python3 scripts/gpu/aot.py ddp [batch] [platform] [n_layer]
(platform cpu compiles the 'ahead of time' side for a CPU mesh: the script's logic, checked without a GPU)."""
from __future__ import annotations

import json
import re
import sys
import time

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from throughput import config

from jaxdp import api, devices, models
from jaxdp.analysis import accounting
from jaxdp.core.run import data

PEAK_BF16, HBM = 989e12, 3.35e12  # H100 SXM datasheet: bf16 dense FLOP/s, HBM3 bytes/s
H100 = dict(threads_per_block_limit=1024, threads_per_warp=32, shared_memory_per_block=49152,
            shared_memory_per_core=233472, threads_per_core_limit=2048, core_count=132, fpus_per_core=128,
            block_dim_limit_x=2147483647, block_dim_limit_y=65535, block_dim_limit_z=65535,
            memory_bandwidth=3352320000000, l2_cache_size=52428800, clock_rate_ghz=1.98,
            device_memory_size=84942979072, shared_memory_per_block_optin=232448,
            registers_per_core_limit=65536, registers_per_block_limit=65536)


def target_config(name: str = "NVIDIA H100 80GB HBM3", fields: dict = H100, drop=()) -> str:
    """A GpuTargetConfig in text form for an H100 SXM (the datasheet's and the CUDA device query's values)."""
    info = "".join(f"  {k}: {v}\n" for k, v in fields.items() if k not in drop)
    cc = "" if "cuda_compute_capability" in drop else "  cuda_compute_capability { major: 9 minor: 0 }\n"
    return (f"gpu_device_info {{\n{info}{cc}}}\nplatform_name: \"CUDA\"\n"
            f"dnn_version_info {{ major: 9 minor: 10 }}\ndevice_description_str: \"{name}\"\n")


def topology_devices(platform: str, log: list, n: int = 1):
    if platform != "gpu":
        return jax.devices("cpu")[:n]
    from jax.experimental import topologies

    drop: list = []
    for _ in range(8):  # the pinned XLA may not read every field: drop the one it names, try again
        try:
            return topologies.get_topology_desc("h100", "cuda", target_config=target_config(drop=drop),
                                                topology=f"1x1x{n}").devices[:n]
        except Exception as e:  # noqa: BLE001 (recorded, then retried without the field)
            log.append(f"{type(e).__name__}: {str(e)[:300]}")
            named = [k for k in (*H100, "cuda_compute_capability") if k in str(e) and k not in drop]
            if not named:
                raise
            drop.append(named[0])
    raise RuntimeError("target config not accepted")


def _cost(program, lowered) -> tuple[dict, str]:
    """The compiled program's cost analysis, else the lowered one's, else none (seen on jax 0.11.2's CUDA
    topology, on an H100: the compiled program gives None and the lowered one raises 'implemented for a
    PjRt-compatible backend only')."""
    try:
        cost = program.cost_analysis()
        if cost:
            return (cost[0] if isinstance(cost, list) else cost), "compiled"
        cost = lowered.cost_analysis() if lowered is not None else None
        return (cost[0] if isinstance(cost, list) else cost) or {}, "lowered (the compiled program gave none)"
    except Exception as e:  # noqa: BLE001 (recorded: the projection then uses the real program's)
        return {}, f"none: {type(e).__name__}: {str(e)[:200]}"


def summary(program, lowered=None) -> dict:
    text = program.as_text()
    names = re.findall(r"\b(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(", text)
    out = {"collectives": sorted(names), "memory": accounting.step_memory(program),
           "fusions": text.count(" fusion("), "custom_calls": text.count("custom-call(")}
    cost, source = _cost(program, lowered)
    return {**out, "flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0)),
            "cost_source": source}


def measured_step_s(cs, steps: int = 6) -> float:
    state, times = cs.state, []
    for _ in range(steps):
        t = time.perf_counter()
        state, metrics = cs.program(state, *cs.batch)
        jax.block_until_ready(metrics["loss"])
        times.append(time.perf_counter() - t)
    return float(np.median(times[1:]))


def aot_summary(cfg, cs, platform: str, log: list, n: int = 1) -> dict:
    """cfg's step compiled for n devices of the topology (no device in hand): the state and batch as
    ShapeDtypeStructs with the real run's partition specs."""
    mesh = Mesh(np.asarray(topology_devices(platform, log, n)), (devices.AXIS,), axis_types=(AxisType.Explicit,))
    with jax.default_device(jax.devices("cpu")[0]):
        model = models.build(cfg, data.load(cfg.data, cfg.seed, cfg.seq_len))
    par = api.parallelize(model, None, cs.optimizer, loss=models.cross_entropy, strategy=cfg.strategy, mesh=mesh)

    def abstract(a):
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, a.sharding.spec))

    lowered = par.strategy.compiled_step.lower(jax.tree.map(abstract, cs.state), *map(abstract, cs.batch))
    return summary(lowered.compile(), lowered)


def main(argv) -> int:
    strategy, batch = argv[0], int(argv[1]) if len(argv) > 1 else 8
    platform = argv[2] if len(argv) > 2 else "gpu"
    cfg = config(batch, platform, int(argv[3]) if len(argv) > 3 else 12).replace(strategy=strategy)
    devices.setup(1, platform)
    cs = accounting.compile_step(cfg)
    real = summary(cs.program)
    log: list = []
    t0 = time.perf_counter()
    aot = aot_summary(cfg, cs, platform, log)
    aot_s = time.perf_counter() - t0
    step_s = measured_step_s(cs)
    cost = aot if aot["flops"] else real  # no cost analysis without a device: the real program's counts
    projected = max(cost["flops"] / PEAK_BF16, cost["bytes"] / HBM)
    peak_diff = aot["memory"]["peak_bytes"] / real["memory"]["peak_bytes"] - 1
    print(json.dumps({"strategy": strategy, "batch": batch, "device": cs.devices[0].device_kind,
                      "aot_compile_s": aot_s, "target_config_log": log, "real": real,
                      "aot": aot, "same_collectives": real["collectives"] == aot["collectives"],
                      "peak_rel_diff": peak_diff, "measured_step_s": step_s, "projected_step_s": projected,
                      "measured_over_projected": step_s / projected if projected else None}))
    if len(argv) > 4:  # and for N devices of the topology (the collectives one GPU cannot show)
        try:
            n8 = aot_summary(cfg, cs, platform, log, int(argv[4]))
            print(json.dumps({"aot_devices": int(argv[4]), "collectives": n8["collectives"], "memory": n8["memory"]}))
        except Exception as e:  # noqa: BLE001 (recorded: what one GPU cannot check)
            print(json.dumps({"aot_devices": int(argv[4]), "error": f"{type(e).__name__}: {str(e)[:500]}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
