"""How the ``plugin`` and later sections call the real ``rdma-macvlan`` through the CNI protocol and
look at what it did (the pod's view, its GID rows, the result)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .host import run
from .report import OUT, STATE, SYS, R, node_policy_env


def cni(
    command: str,
    pod: str,
    bond: str,
    *,
    netns: str | None = None,
    rdma: dict[str, Any] | None = None,
    prev: dict[str, Any] | None = None,
    ifname: str = "net1",
    extra: dict[str, Any] | None = None,
    failpoint: str | None = None,
) -> tuple[int, dict[str, Any] | None, str]:
    """Call the real rdma-macvlan entry point as a runtime does (env + config on stdin).

    ``bond`` is the one master the network may use, or several separated by commas."""
    conf: dict[str, Any] = {
        "cniVersion": "1.1.0",
        "name": "rdma-e2e",
        "type": "rdma-macvlan",
        "masters": bond.split(","),
        **(extra or {}),
        "sysfsRoot": SYS,
        "rdma": {"required": True, **(rdma or {})},
        "dataDir": str(STATE / "data"),
        "runDir": str(STATE / "run"),
        "logFile": str(OUT / "plugin.log"),
        "logLevel": "debug",
    }
    if prev is not None:
        conf["prevResult"] = prev
    env = {
        "PATH": os.environ["PATH"],
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": f"e2e-{pod}",
        "CNI_NETNS": f"/run/netns/{pod}" if netns is None else netns,
        "CNI_IFNAME": ifname,
        "CNI_PATH": "/usr/lib/cni:/opt/cni/bin",
        "CNI_ARGS": f"IgnoreUnknown=true;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}",
        **node_policy_env(),
    }
    if failpoint:
        env["RDMA_CNI_FAILPOINT"] = failpoint  # the plugin's test hook: kill -9 itself / fail at a step
    t0 = time.monotonic()
    proc = run(
        [sys.executable, "-m", "rdma_cni.cli.macvlan"],
        stdin=json.dumps(conf),
        env=env,
        timeout=180,
        ok=range(-64, 256),
    )
    seconds = round(time.monotonic() - t0, 2)
    try:
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        out = {"unparsable stdout": proc.stdout}
    R.fact(
        f"{command} {pod}",
        {"rc": proc.returncode, "seconds": seconds, "stdout": out, "stderr": proc.stderr[-2000:]},
    )
    return proc.returncode, out, proc.stderr


def status(bond: str, rdma: dict[str, Any] | None = None) -> tuple[int, dict[str, Any] | None]:
    """STATUS (CNI 1.1): could an ADD succeed now? Only the config and CNI_COMMAND/CNI_PATH."""
    conf = {
        "cniVersion": "1.1.0",
        "name": "rdma-e2e",
        "type": "rdma-macvlan",
        "masters": [bond],
        "sysfsRoot": SYS,
        "rdma": {"required": True, **(rdma or {})},
        "dataDir": str(STATE / "data"),
        "runDir": str(STATE / "run"),
        "logFile": str(OUT / "plugin.log"),
        "logLevel": "debug",
    }
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "STATUS", "CNI_PATH": "/usr/lib/cni:/opt/cni/bin",
           **node_policy_env()}
    proc = run(
        [sys.executable, "-m", "rdma_cni.cli.macvlan"],
        stdin=json.dumps(conf),
        env=env,
        timeout=180,
        ok=range(-64, 256),
    )
    out = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    R.fact(
        f"STATUS {bond} {rdma or ''}", {"rc": proc.returncode, "stdout": out, "stderr": proc.stderr[-1500:]}
    )
    return proc.returncode, out


def pod_view(pod: str, dev: str, ipv4: str, index: int | None) -> None:
    """What a user in the pod is told to put in NCCL_IB_GID_INDEX: ``cni-tool gids --netns``."""
    rows = pod_gid_rows(pod, dev)
    if rows is None:
        return
    found = [r.get("index") for r in rows if r.get("ipv4") == ipv4 and r.get("type") == "RoCE v2"]
    R.check(f"cni-tool gids inside {pod}: RoCE v2 index of {ipv4} equals the host's", [index], found, rows)


def pod_gid_rows(pod: str, dev: str | None = None) -> list[dict[str, Any]] | None:
    """``cni-tool gids --netns`` of ``pod`` (one device, or all): its JSON rows, None when it failed
    (recorded) or the checkout has no such command (skipped)."""
    if importlib.util.find_spec("rdma_cni.cli.tool_gids") is None:
        R.skip(f"cni-tool gids in {pod}", "rdma_cni/cli/tool_gids.py is not present")
        return None
    argv = [sys.executable, "-m", "rdma_cni.cli.tool", "gids", *([dev] if dev else [])]
    proc = run([*argv, "--netns", f"/run/netns/{pod}", "--json"], ok=range(-64, 256), timeout=120)
    try:
        rows = json.loads(proc.stdout)
    except json.JSONDecodeError:
        R.check(f"cni-tool gids --netns {pod} prints JSON", True, False, proc.stdout + proc.stderr)
        return None
    return rows if isinstance(rows, list) else rows.get("gids", []) if isinstance(rows, dict) else []


def result_ips(result: dict[str, Any] | None) -> list[str]:
    return sorted(i["address"] for i in (result or {}).get("ips", []))


def pod_ifname(result: dict[str, Any] | None, pod: str) -> str | None:
    for iface in (result or {}).get("interfaces", []):
        if iface.get("sandbox") == f"/run/netns/{pod}":
            return str(iface["name"])
    return None


def plugin_available() -> str | None:
    """Why the plugin section cannot run, or None."""
    if importlib.util.find_spec("rdma_cni.cli.macvlan") is None:
        return "rdma_cni/cli/macvlan.py (H2's rdma-macvlan entry point) is not in this checkout"
    return None


def plugin_rdma_missing() -> str | None:
    """Why the plugin cannot do its RDMA part yet (no GID record, no netns-mode check), or None.

    While the plugin is being built its address moves can already be checked here; what needs its
    RDMA path is skipped with this reason instead of failing for a reason everybody knows.
    """
    spec = importlib.util.find_spec("rdma_cni.plugins")
    folder = Path(next(iter(spec.submodule_search_locations or []))) if spec else None
    sources = sorted(folder.glob("macvlan/*.py")) if folder else []
    if not any(
        "rdma_cni.rdma" in f.read_text() or "from rdma_cni import rdma" in f.read_text() for f in sources
    ):
        return (
            "rdma-macvlan does not use rdma_cni.rdma yet (no import in rdma_cni/plugins/macvlan/*.py): "
            "it writes no GID record and checks no RDMA netns mode"
        )
    return None


def gid_records(pod: str) -> list[Path]:
    return sorted((STATE / "run" / "gid" / f"e2e-{pod}").glob("*.json"))
