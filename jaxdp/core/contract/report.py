"""The contract's report: each collective a step runs (`Comm`), each departure from the intent (`Finding`,
with `kind`, `message`, `fix`), and `Report` (`ok`: no finding) rendered as text and as JSON. These names and
keys are a contract: scripts read them (docs/CHECK.md)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Comm:
    """One collective of the step. `elements`: its full logical size (an all-reduce's tensor, a reduce-scatter's
    input, an all-gather's output, a collective-permute's message); `bytes` those elements' bytes; `axis` the mesh
    axis (or ranks) its group runs over, `group` the devices in it; `count` runs per step (None: a loop of unknown
    trip count); `overlaps` whether compute runs while it is in flight (None: not readable from this program);
    `ran_as` what the backend really ran, where it differs (gloo runs a reduce-scatter as an all-reduce);
    `branch`: it lies in a conditional's branch, run only on the steps that take it (diloco's outer step)."""
    op: str
    dtype: str
    elements: int
    bytes: int
    axis: str
    group: int
    count: int | None = 1
    overlaps: bool | None = None
    ran_as: str = ""
    branch: bool = False


@dataclass(frozen=True)
class Finding:
    """A departure from the intent: `kind` (a name from `judge.KINDS`), `message` (what the program does, in the
    user's terms) and `fix` (what to change)."""
    kind: str
    message: str
    fix: str


@dataclass
class Report:
    """`ok` is True when nothing departs from the intent. `comms` in program (or issue) order; `facts` what the
    judge read (intent, devices, parameters, bytes per step)."""
    intent: str
    comms: list[Comm] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    facts: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict:
        return {"ok": self.ok, "intent": self.intent, "facts": self.facts,
                "findings": [asdict(f) for f in self.findings], "collectives": [asdict(c) for c in self.comms]}

    @classmethod
    def from_dict(cls, d: dict) -> Report:
        """The inverse of `to_dict` (a report kept in a cache or a JSON file)."""
        return cls(d["intent"], [Comm(**c) for c in d.get("collectives", [])],
                   [Finding(**f) for f in d.get("findings", [])], dict(d.get("facts", {})))

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_text(self) -> str:
        return "\n".join(lines(self))

    def __str__(self) -> str:
        return self.to_text()


def _overlap(c: Comm) -> str:
    return "?" if c.overlaps is None else "yes" if c.overlaps else "no"


def lines(r: Report) -> list[str]:
    """The report as text: a header, one line per collective, then one line per finding with its fix."""
    f = r.facts
    out = [f"communication contract: intent {r.intent} (accumulation {f.get('accumulation', 1)}, reduce dtype "
           f"{f.get('reduce_dtype', 'float32')}, master dtype {f.get('master_dtype', 'float32')}) on "
           f"{f.get('devices', '?')} data-parallel devices, {f.get('param_elements', '?')} parameter elements",
           f"  {'op':<18} {'dtype':<9} {'elements':>10} {'bytes':>11} {'group':<14} {'per step':>8} {'overlaps':>8}"]
    for c in r.comms:
        ran = f"  ran as {c.ran_as}" if c.ran_as else ""
        out.append(f"  {c.op:<18} {c.dtype:<9} {c.elements:>10} {c.bytes:>11} {f'{c.axis} ({c.group})':<14} "
                   f"{c.count if c.count is not None else '?':>8} {_overlap(c):>8}{ran}")
    if not r.comms:
        out.append("  (no collective)")
    if "bytes_per_step" in f:
        theory = f" (textbook {f['theory_bytes_per_step']:.0f})" if f.get("theory_bytes_per_step") is not None else ""
        out.append(f"  bytes sent per device per step (ring algorithms): {f['bytes_per_step']:.0f}{theory}")
    if r.ok:
        out.append(f"OK: the program communicates as {r.intent} intends")
    for x in r.findings:
        out.append(f"DEPARTS [{x.kind}] {x.message}; fix: {x.fix}")
    return out
