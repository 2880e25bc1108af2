"""`jaxdp check`: a user's own jitted step, compiled, its collectives read from the program and set against
what the user meant (`jaxdp.check`, docs/CHECK.md). The neutral parts (intent, judge, report) are in
jaxdp/core/contract/, shared with torch_ref/contract/."""
