"""hsdp at scale: `--replicas` with several strategies (compare, memory, train a,b), `--hsdp-hosts`
(which whole groups a process holds; two jax.distributed processes, each holding one shard group, are
in tests/jaxdp/test_multiprocess.py), and the projection's network (jaxdp/analysis/network.py: NCCL on NVLink
inside a node and all 8 NICs of a node across nodes; hsdp at S = 8 is zero3 inside a node and trails it across
nodes, its all-reduce on one NIC per GPU). Each check is shown to fail on a broken
input."""
from __future__ import annotations

import pytest

from jaxdp import devices
from jaxdp.analysis import network
from jaxdp.core.run import hsdp_hosts
from jaxdp.core.run.config import ConfigError
from jaxdp.core.traces import trace
from jaxdp.harness.report import links, projection, references, render
from tests.conftest import BASE, run
from tests.jaxdp.harness.test_cli import error_of


@pytest.mark.parametrize("argv,message", [
    (["memory", "--strategies", "ddp,zero3", "--replicas", "2", "--devices", "4"],
     "--replicas is read only by --strategy hsdp, not ddp, zero3: drop --replicas"),
    (["compare", "--strategies", "ddp,zero3", "--replicas", "2", "--devices", "4"],
     "--replicas is read only by --strategy hsdp, not ddp, zero3: drop --replicas"),
    (["train", "--strategy", "ddp,zero3", "--replicas", "2", "--devices", "4"],
     "--replicas is read only by --strategy hsdp, not ddp, zero3: drop --replicas"),
    (["train", "--strategy", "hsdp", "--replicas", "1", "--devices", "4", "--processes", "2"],
     "--hsdp-hosts shard: --processes 2 cannot each hold whole shard groups (rows) of the --replicas 1 x 4 grid"),
    (["train", "--strategy", "hsdp", "--replicas", "4", "--devices", "4", "--processes", "2", "--hsdp-hosts",
      "replica"], "--hsdp-hosts replica: --processes 2 cannot each hold whole replica groups"),
    (["train", "--strategy", "ddp", "--hsdp-hosts", "replica", "--devices", "4"],
     "--hsdp-hosts is read only by --strategy hsdp, not ddp: drop --hsdp-hosts")])
def test_replicas_and_hosts_errors_are_one_line(argv, message, capsys):
    err = error_of(argv, capsys)
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_torch_refuses_a_layout_its_hosts_cannot_hold(monkeypatch, capsys):
    """Under torchrun on 2 hosts of 2 ranks (LOCAL_WORLD_SIZE 2 of 4): whole replica groups of a 4 x 1 grid
    do not fit; one line before any rank starts."""
    from jaxdp.harness import torch_cli

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    argv = ["train", "--strategy", "hsdp", "--replicas", "4", "--devices", "4", "--hsdp-hosts", "replica"]
    assert torch_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--hsdp-hosts replica: torchrun --nnodes 2 cannot each hold whole replica groups" in err
    assert len(err.strip().splitlines()) == 1


def test_replicas_go_to_the_hsdp_entries_only():
    cfg = BASE.replace(devices=4, replicas=2, hsdp_hosts="replica")
    assert [hsdp_hosts.per_strategy(cfg, s).replicas for s in ("ddp", "hsdp", "zero3")] == [1, 2, 1]
    hsdp_hosts.check_listed(2, ["ddp", "hsdp"])
    with pytest.raises(ConfigError):
        hsdp_hosts.check_listed(2, ["ddp"])


def test_host_layouts_hold_whole_groups():
    assert hsdp_hosts.grid_order(8, 2, "shard") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert hsdp_hosts.grid_order(8, 2, "replica") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    hsdp_hosts.check_hosts(8, 2, 2, "shard")
    hsdp_hosts.check_hosts(8, 2, 4, "replica")
    for bad in [(8, 2, 4, "shard"), (8, 4, 4, "replica"), (8, 2, 3, "shard")]:
        with pytest.raises(ConfigError, match="--hsdp-hosts"):
            hsdp_hosts.check_hosts(*bad)
    # the multi-process check below (each row in one process) fails on the column-major grid
    per = 4  # devices per process, 2 processes of 4
    assert [{k // per for k in row} for row in hsdp_hosts.grid_order(8, 2, "shard")] == [{0}, {1}]
    assert [{k // per for k in row} for row in hsdp_hosts.grid_order(8, 2, "replica")] == [{0, 1}, {0, 1}]
    mesh = devices.mesh(devices.setup(4))
    assert [[d for d, _ in row] for row in devices.grid_rows(devices.grid(mesh, 2, "replica"))] == [[0, 2], [1, 3]]


def test_replica_layout_equals_single():
    cfg = BASE.replace(strategy="hsdp", devices=4, replicas=2, hsdp_hosts="replica", optimizer="adamw", accum=3)
    got, ref = run(cfg), run(cfg.replace(strategy="single", devices=1, replicas=1, hsdp_hosts="shard"))
    assert got.meta["hsdp_grid"] == [[[0, 0], [2, 0]], [[1, 0], [3, 0]]]
    worst = trace.diff(trace.Trace(got.meta, got.arrays), trace.Trace(ref.meta, ref.arrays))["worst"]
    assert max(worst.values()) < 1e-12


LLAMA = references.LLAMA3_8B


def _eff(strategy, n):
    return links.row(LLAMA, strategy, n)["weak_efficiency"]


def test_hsdp_equals_zero3_inside_a_node_and_trails_it_across_nodes(monkeypatch):
    """Inside a node hsdp is zero3. Across nodes NCCL's 1-D rings cross on all 8 NICs of a node (400 GB/s, near
    NVLink's 450), while hsdp's all-reduce of Psi / 8 runs on one NIC per GPU after its in-node phases: zero3
    keeps more of its efficiency. Priced at one NIC per node (the old model) hsdp wins by far: caught here."""
    assert _eff("hsdp", 8) == _eff("zero3", 8)
    assert all(_eff("zero3", n) > _eff("hsdp", n) for n in (16, 128, 1024))
    assert _eff("zero3", 128) > 0.95 * _eff("zero3", 8)
    one_nic(monkeypatch)
    assert all(_eff("hsdp", n) > _eff("zero3", n) + 0.2 for n in (16, 128, 1024))


def one_nic(monkeypatch):
    """The pricing the network model replaced: every byte that crosses nodes through one NIC."""
    monkeypatch.setattr(network, "bus_bytes_s",
                        lambda group, nodes, f: f.nvlink_bytes_s if nodes <= 1 else f.nic_bytes_s)


def test_the_network_as_built_is_used(monkeypatch):
    """Every collective priced by jaxdp/analysis/network.py, by hand here: zero3 on 128 GPUs (16 nodes): three
    rings whose bus bandwidth is min(NVLink, 8 NICs x 50 GB/s) = 400 GB/s, each with NCCL's base latency, an NVLink
    step per in-node hop and a network step per node crossing; hsdp: its three rings on one node's NVLink and a
    16-node all-reduce of Psi / 8 on one NIC (ring or tree, whichever is faster)."""
    pre, p = projection.H100_NVLINK_IB, references.params(LLAMA)
    ring = network.RING_BASE_S + 112 * network.RING_NVLINK_HOP_S + 15 * network.RING_NET_HOP_S
    assert links.comm_seconds("zero3", p, 128) == pytest.approx(3 * ring + 8 * p * 127 / 128 / 400e9)
    inside = 3 * (network.RING_BASE_S + 7 * network.RING_NVLINK_HOP_S) + 8 * p * 7 / 8 / pre.nvlink_bytes_s
    cross_ring = network.RING_BASE_S + 30 * network.RING_NET_HOP_S + 2 * (4 * p / 8) * 15 / 16 / pre.ib_bytes_s
    cross_tree = 2 * 4 * network.TREE_NET_HOP_S + (4 * p / 8) / (network.TREE_BUS_FACTOR * pre.ib_bytes_s)
    assert links.comm_seconds("hsdp", p, 128) == pytest.approx(inside + min(cross_ring, cross_tree))
    honest = links.comm_seconds("zero3", p, 128)
    one_nic(monkeypatch)
    assert links.comm_seconds("zero3", p, 128) > 7 * honest


def test_report_shows_the_link_table_and_the_published_point():
    proj = projection.for_report({"zero3": 9.0 * 7000, "hsdp": 8.0 * 7000}, 7000, 4, 4e4, 4, 64, "mlp")
    rows = render._links_rows({"projection": proj})
    assert {r[1] for r in rows} == {"zero3", "hsdp"} and len(rows) == 16  # the projection's rows: what it measured
    assert all(v == f"{float(v):.1g}" for r in rows for v in r[-2:])  # modelled: one significant figure
    lines = render._published_lines({"projection": proj})
    assert len(lines) == 1 and "97%" in lines[0] and "hsdp" in lines[0]
    hsdp = proj["models"]["Llama 3 8B"]["strategies"]["hsdp"]["rows"]
    zero3 = proj["models"]["Llama 3 8B"]["strategies"]["zero3"]["rows"]
    assert hsdp[0]["weak_efficiency"] == pytest.approx(zero3[0]["weak_efficiency"], rel=0.01)
    assert zero3[-1]["weak_efficiency"] > hsdp[-1]["weak_efficiency"]


TOLERANCE = 0.2  # a published point matched in configuration: within 20% (docs/GPU.md's calibration targets)


def test_the_published_point_is_within_the_tolerance_and_one_nic_is_not(monkeypatch):
    """torchtitan's FSDP2 keeps 97.3% of its per-GPU throughput from 8 to 128 H100s: the projection's zero3 (no
    overlap, its lower bound) keeps within 20% of it, at most the full-overlap bound. Priced at one NIC per node
    the projection keeps about 70%: outside the tolerance, so this test catches it."""
    def kept():
        (p,) = links.published()
        return p, p["projected"]["zero3"]

    p, z = kept()
    assert abs(z["weak_efficiency"] / p["kept"] - 1) < TOLERANCE and z["weak_efficiency"] <= z["overlapped_efficiency"]
    assert p["projected"]["hsdp"]["weak_efficiency"] < z["weak_efficiency"]
    one_nic(monkeypatch)
    p, z = kept()
    assert abs(z["weak_efficiency"] / p["kept"] - 1) > TOLERANCE
