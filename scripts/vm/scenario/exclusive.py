"""Section ``exclusive``: the kernel in ``exclusive`` RDMA netns mode: ADD fails clearly and changes
nothing."""

from __future__ import annotations

from .cni import cni, plugin_available, plugin_rdma_missing, status
from .host import host_snapshot, ip, netns_mode, pod_links, retry, run
from .report import R


def set_netns_mode(mode: str) -> None:
    """Only possible while no other netns exists; a deleted netns lingers briefly, hence the retry."""
    retry(lambda: run(["rdma", "system", "set", "netns", mode]), 10)


def exclusive_section() -> None:
    missing = plugin_available() or plugin_rdma_missing()
    if missing:
        R.skip("exclusive", missing)
        return
    set_netns_mode("exclusive")
    R.fact("netns_mode after 'rdma system set netns exclusive'", netns_mode())
    ip(["netns add pod3"])
    try:
        rc, out = status("bond0")
        R.check(
            "STATUS, config shared, kernel exclusive: code 50 (plugin not available)",
            50,
            (out or {}).get("code"),
            out,
        )
        R.check("STATUS, config shared, kernel exclusive: non-zero exit", True, rc != 0)
        before = host_snapshot()
        r = run(["rdma", "dev", "set", "mlx5_bond_0", "netns", "pod3"], ok=range(-64, 256))
        R.fact(
            "rxe moved to a netns by hand (exclusive mode)", {"rc": r.returncode, "stderr": r.stderr.strip()}
        )
        for label, rdma, must_say in (
            ("config shared, kernel exclusive", {"netnsMode": "shared"}, "rdma system set netns shared"),
            ("config exclusive, rxe cannot move", {"netnsMode": "exclusive"}, "mlx5_bond_0"),
        ):
            rc, out, _ = cni("ADD", "pod3", "bond0", rdma=rdma)
            msg = (out or {}).get("msg", "") + " " + str((out or {}).get("details", ""))
            R.check(f"exclusive mode, {label}: ADD fails", True, rc != 0, out)
            R.check(
                f"exclusive mode, {label}: error JSON has a code",
                True,
                isinstance((out or {}).get("code"), int),
            )
            R.check(f"exclusive mode, {label}: the message says {must_say!r}", True, must_say in msg, msg)
            R.check(f"exclusive mode, {label}: host unchanged", before, host_snapshot())
            R.check(f"exclusive mode, {label}: nothing left in the pod", ["lo"], pod_links("pod3"))
            rc, _, _ = cni("DEL", "pod3", "bond0", rdma=rdma)
            R.check(f"exclusive mode, {label}: DEL after the failed ADD succeeds", 0, rc)
            R.check(f"exclusive mode, {label}: host unchanged after DEL", before, host_snapshot())
    finally:
        ip(["netns del pod3"])
        set_netns_mode("shared")
