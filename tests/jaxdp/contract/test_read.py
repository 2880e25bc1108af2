"""Reading a compiled program's collectives onto the user's mesh axes, in each replica-group format XLA writes."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp.contract import read

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("groups,axis", [
    ([[0, 2], [1, 3]], "replica"), ([[0, 1], [2, 3]], "data"), ([[0, 1, 2, 3]], "replica+data"),
    ([[0, 3], [1, 2]], "devices 0,3"), ([[0], [1]], "none")])
def test_a_group_is_named_by_the_axes_its_members_differ_along(groups, axis):
    assert read.axis_of(groups, (2, 2), ("replica", "data")) == axis


def test_an_explicit_axes_mesh_reduction_is_read_on_its_axis():
    """On an explicit-axes mesh XLA writes the groups as mesh axes (`mesh['axis_0'=2,'axis_1'=2] {'axis_0'}`):
    a sum over the rows sharded on 'a' reduces over 'a' alone, in groups of 2."""
    mesh = jax.make_mesh((2, 2), ("a", "b"), axis_types=(AxisType.Explicit,) * 2, devices=jax.devices()[:4])
    x = jax.device_put(np.ones((8, 6), np.float32), NamedSharding(mesh, P("a", "b")))
    text = jax.jit(lambda x: jnp.sum(x, axis=0)).lower(x).compile().as_text()
    assert "replica_groups=mesh[" in text
    (c,) = read.comms(text, (2, 2), ("a", "b"))
    assert (c.op, c.axis, c.group, c.elements) == ("all-reduce", "a", 2, 3)
