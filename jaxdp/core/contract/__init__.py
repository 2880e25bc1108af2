"""The communication contract, framework-neutral: what a data-parallel step sends (`report.Comm`, read from
XLA's compiled program by jaxdp/contract/read.py or from the process group by torch_ref/contract/read.py),
what the user meant (`intent.Intent`), and where the two part (`judge.findings`). docs/CHECK.md."""
