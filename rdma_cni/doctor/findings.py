"""One line of a diagnosis: what was checked, how it stands, and how to fix it.

Finding("rdma-netns-mode", FAIL, "kernel RDMA netns mode is exclusive", fix="rdma system set netns shared")
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

OK = "OK"
WARN = "WARN"
FAIL = "FAIL"
SKIP = "SKIP"  # not applicable here (e.g. no kubelet on this machine); never fails the run


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when anything FAILed: a node that cannot start an RDMA pod must fail a readiness probe."""
    return 1 if any(f.status == FAIL for f in findings) else 0


def render_text(findings: Sequence[Finding]) -> str:
    width = max((len(f.check) for f in findings), default=0)
    lines = []
    for f in findings:
        line = f"{f.status:<4} {f.check:<{width}}  {f.detail}"
        if f.fix and f.status in (WARN, FAIL):
            line += f"\n     {'':<{width}}  fix: {f.fix}"
        lines.append(line)
    counts = {s: sum(1 for f in findings if f.status == s) for s in (OK, WARN, FAIL)}
    lines.append(f"{counts[OK]} ok, {counts[WARN]} warnings, {counts[FAIL]} failures")
    return "\n".join(lines) + "\n"


def render_json(findings: Sequence[Finding]) -> str:
    return (
        json.dumps({"ok": exit_code(findings) == 0, "findings": [asdict(f) for f in findings]}, indent=1)
        + "\n"
    )
