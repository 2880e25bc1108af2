"""`torch_ref.check`: one step of a user's torch model (DDP, FSDP2, ZeroRedundancyOptimizer or hand-written)
run on an initialised process group, its collectives recorded as the process group is handed them, and judged
against the intent (jaxdp/core/contract/, docs/CHECK.md). The twin of jaxdp/contract/."""
