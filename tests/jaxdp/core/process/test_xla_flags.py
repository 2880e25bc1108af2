"""What a child jaxdp process inherits of XLA_FLAGS (`jaxdp.core.process.xla_flags`): the user's flags, in order,
without the two each process sets for itself."""
from jaxdp.core.process import xla_flags


def test_a_child_keeps_the_users_flags_and_drops_the_per_process_ones():
    env = {"PATH": "/bin", "XLA_FLAGS": "--xla_dump_to=/d --xla_cpu_max_isa=AVX "
                                        "--xla_force_host_platform_device_count=8 --xla_cpu_use_fusion_emitters=false"}
    child = xla_flags.for_child(env)
    assert child == {"PATH": "/bin", "XLA_FLAGS": "--xla_dump_to=/d --xla_cpu_use_fusion_emitters=false"}
    assert env["XLA_FLAGS"].startswith("--xla_dump_to")  # the parent's mapping is not changed


def test_nothing_left_drops_the_variable():
    assert xla_flags.for_child({"XLA_FLAGS": " --xla_cpu_max_isa=AVX "}) == {}
    assert xla_flags.for_child({"HOME": "/h"}) == {"HOME": "/h"}
