"""Section ``crash``: kill -9 and failures mid-ADD, then DEL or GC: the host exactly as it was."""

from __future__ import annotations

from .cni import cni, plugin_available, plugin_rdma_missing
from .host import addresses, host_snapshot, ip, pod_links, v2_index
from .report import BONDS, R


def crash_section() -> None:
    """The plugin dies (kill -9) or fails at its most delicate moments, on real GID tables."""
    missing = plugin_available() or plugin_rdma_missing()
    if missing:
        R.skip("crash", missing)
        return
    before = host_snapshot()
    host_idx = {a: v2_index("mlx5_bond_0", a) for a in BONDS["bond0"][2]}
    for label, failpoint, delete_netns_first in (
        ("kill -9 with the addresses on neither side, then DEL", "addresses-removed", False),
        ("kill -9 with the addresses in the pod, netns deleted, then DEL", "addresses-added", True),
        ("I/O error after the GID check: ADD rolls back", "rdma-checked:error", False),
    ):
        ip(["netns add pod5"])
        rc, out, _ = cni("ADD", "pod5", "bond0", failpoint=failpoint)
        R.check(f"{label}: ADD did not succeed", True, rc != 0, out)
        if failpoint.endswith(":error"):
            R.check(f"{label}: error JSON with a code", True, isinstance((out or {}).get("code"), int), out)
            R.check(f"{label}: host restored by the failed ADD itself", before, host_snapshot())
        else:
            R.check(f"{label}: killed (-9)", -9, rc)
        if delete_netns_first:
            ip(["netns del pod5"])
        rc, _, _ = cni("DEL", "pod5", "bond0")
        R.check(f"{label}: DEL exit code", 0, rc)
        R.check(
            f"{label}: bond0 has its addresses back in order",
            ["198.51.100.10/24", "198.51.100.20/24 secondary"],
            addresses("bond0"),
        )
        for a, index in host_idx.items():
            R.check(f"{label}: {a} back at the host's GID index", index, v2_index("mlx5_bond_0", a))
        if not delete_netns_first:
            R.check(f"{label}: nothing left in the pod", ["lo"], pod_links("pod5"))
            ip(["netns del pod5"])
    # a node that lost its runtime's memory (crash, reboot): GC with no valid attachment heals it
    ip(["netns add pod6"])
    rc, _, _ = cni("ADD", "pod6", "bond0")
    R.check("GC: ADD pod6 exit code", 0, rc)
    ip(["netns del pod6"])
    R.check("GC: the pod's netns is gone and bond0 still lacks its addresses", [], addresses("bond0"))
    rc, out, _ = cni("GC", "pod6", "bond0", extra={"cni.dev/valid-attachments": []})
    R.check("GC with no valid attachments: exit code", 0, rc, out)
    for a, index in host_idx.items():
        R.check(f"GC: {a} back at the host's GID index", index, v2_index("mlx5_bond_0", a))
    R.check("host as before the crashes", before, host_snapshot())
