"""What every section reports to: the JSON-lines results (``R``) and the node's constants."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

OUT = Path(os.environ.get("VM_OUT", "/tmp/vm-e2e-out"))
STATE = Path("/run/vm-e2e")  # the plugin's dataDir/runDir inside the guest (tmpfs)
SYS = "/sys"


def node_policy_env() -> dict[str, str]:
    """The node policy of the guest (rdma_cni/node_policy.py): the scenario writes every config
    itself, with its own paths and knobs (netns modes, rdma.required), and no tenant writes any, so
    the configs decide (``trust: configs``, the admin's explicit choice for such a node)."""
    path = STATE / "node-policy.json"
    if not path.exists():
        STATE.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"trust": "configs"}))
    return {"RDMA_CNI_NODE_POLICY": str(path)}
GID_SLOTS = 32  # slots scanned per table: rxe fills from 0, the scenario never uses more than a few
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
PINGPONG_PORT = 18515
ROCE_PORT = 4791  # RoCE v2 is UDP to this port

# bond -> (RDMA device, slaves, addresses primary first). bond0/bond1 are wired back to back by
# the veth pairs a0-b0 and a1-b1, so pods on them can reach each other; bond2 (dummy slaves) is the
# kernel section's own, so its experiments never disturb the plugin's bonds.
BONDS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "bond0": ("mlx5_bond_0", ("a0", "a1"), ("198.51.100.10/24", "198.51.100.20/24")),
    "bond1": ("mlx5_bond_1", ("b0", "b1"), ("198.51.100.11/24",)),
    "bond2": ("mlx5_bond_2", ("d0", "d1"), ("198.51.100.30/24", "198.51.100.31/24")),
}


class CommandFailed(RuntimeError):
    def __init__(self, argv: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
        self.proc = proc


class Results:
    """The JSON-lines report; also echoed readably to stdout (the guest log)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("w")
        self.section = "setup"
        self.failed = 0
        self.t0 = time.monotonic()

    def write(self, kind: str, name: str, **fields: Any) -> None:
        rec = {
            "kind": kind,
            "section": self.section,
            "name": name,
            "t": round(time.monotonic() - self.t0, 2),
            **fields,
        }
        self.file.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        self.file.flush()

    def check(self, name: str, expected: Any, actual: Any, detail: Any = None) -> bool:
        ok = bool(expected == actual)
        self.failed += not ok
        self.write("check", name, ok=ok, expected=expected, actual=actual, detail=detail)
        print(
            f"{'PASS' if ok else 'FAIL'} [{self.section}] {name}: expected {expected!r}, got {actual!r}",
            flush=True,
        )
        return ok

    def fact(self, name: str, value: Any) -> None:
        self.write("fact", name, value=value)
        print(f"FACT [{self.section}] {name}: {json.dumps(value, default=str)[:400]}", flush=True)

    def skip(self, name: str, reason: str) -> None:
        self.write("skip", name, reason=reason)
        print(f"SKIP [{self.section}] {name}: {reason}", flush=True)


R = Results(OUT / "results.jsonl")
