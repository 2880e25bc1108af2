"""Everything that runs both frameworks: the judge (parity, error model), paired runs, divergence, the
`jaxdp` command line, the compare report, the benchmarks and the mutation catalogue. The only part of
jaxdp that imports torch_ref."""
