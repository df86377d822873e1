"""``scripts/demo --mode shared`` end to end: TKE's shared RDMA NIC mode on the simulated node. It must
succeed, show what it promises (the shared pool of 1000, each pod's Allocate of every RDMA device,
two pods with addresses and GID indexes of their own on every bond, the pings, state and doctor, the
node restored) and leave nothing behind: no namespace, no temp dir, no process, also on Ctrl-C."""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rdma_cni.cli.demo import command

REPO = Path(__file__).resolve().parents[2]
DEMO = [str(REPO / "scripts" / "demo"), "--mode", "shared"]
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
BONDS = 4


def _skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("the demo needs root")
    if not any(os.access(f"{d}/ptp", os.X_OK) for d in ("/usr/lib/cni", "/opt/cni/bin")):
        pytest.skip("reference CNI plugins missing (scripts/setup installs containernetworking-plugins)")


def leftovers(pid: int) -> list[str]:
    """Namespaces, temp dirs and processes of the demo run whose python process had ``pid``."""
    tag = f"h6-demo-{pid}-"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    found = [line.split()[0] for line in names.splitlines() if line.startswith(tag)]
    found += [str(p) for p in Path("/tmp").glob(f"{tag}*")]
    for entry in Path("/proc").iterdir():  # the device plugin and the simulated node name the run's dirs
        try:
            cmdline = (
                (entry / "cmdline").read_bytes().decode(errors="replace") if entry.name.isdigit() else ""
            )
        except OSError:
            continue
        if tag in cmdline:
            found.append(f"process {entry.name}: {cmdline.replace(chr(0), ' ')[:200]}")
    return found


def run_pid(out: str) -> int:
    return int(out.split("h6-demo-")[1].split("-")[0])


@pytest.mark.netns
def test_shared_demo_shows_two_pods_sharing_every_bond_and_restores_the_node() -> None:
    _skip_unless_possible()
    proc = subprocess.run(DEMO, capture_output=True, text=True, timeout=400, cwd=REPO, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for expected in (
        # the device plugin's shared pool and each pod's allocation
        "mode: shared, sharedCount 1000",
        f"-> node capacity {RESOURCE}: 1000, allocatable: 1000",
        'virtual devices "0".."999", all Healthy',
        "kubelet admits pod rdma-demo-0 asking for 1",
        "kubelet admits pod rdma-demo-1 asking for 1",
        "/dev/infiniband/uverbs3    <- ",
        "/dev/infiniband/issm3      <- ",
        "/dev/infiniband/rdma_cm    <- ",
        "NCCL_IB_HCA==mlx5_bond_0,mlx5_bond_1,mlx5_bond_2,mlx5_bond_3",
        "UCX_NET_DEVICES=mlx5_bond_0:1,mlx5_bond_1:1,mlx5_bond_2:1,mlx5_bond_3:1",
        "the same 13 device nodes and env as rdma-demo-0's",
        # the network: rdma-ipvlan through rdma-multus, the kernel's missing IPVLAN said
        "tke.cloud.tencent.com/networks: tke-route-eni,tke-rdma-ipvlan",
        "this kernel has no IPVLAN",
        "lookup 103",  # a table of its own per bond
        "(compared: unchanged)",
        # operators: state (who holds which) and doctor
        "bond0 198.51.100.0/28: 10 free, 2 held",
        "pod default/rdma-demo-0",
        "pod default/rdma-demo-1",
        "OK   config tke-rdma-ipvlan",
        "OK   shared-pool",
        "OK   device-plugin tke.cloud.tencent.com/tke-shared-rdma",
        "0 warnings, 0 failures",
        "-> node restored",
        "rdma-device-plugin stopped (SIGTERM, exit code 0): its socket removed",
        "demo OK",
    ):
        assert expected in out, f"missing {expected!r} in:\n{out[-8000:]}"
    allocations = out[out.index("=== 2.") : out.index("=== 3.")]
    assert "GID_INDEX=" not in allocations  # no GID-index env from a shared pool
    addresses = _pod_addresses(out)
    _gid_indexes(out, addresses)
    assert len(re.findall(r"-> switch 198\.51\.100\.\d+: reply in", out)) == 2 * BONDS
    assert len(re.findall(r"-> pod rdma-demo-\d 198\.51\.100\.\d+: reply in", out)) == 2 * BONDS
    assert leftovers(run_pid(out)) == []


def _pod_addresses(out: str) -> dict[str, list[str]]:
    """bond -> the two pods' addresses, each its own, in the bond's subnet, never the node's."""
    rows = re.findall(r"-> (bond\d) \((\S+)\): the node (\S+), rdma-demo-0 (\S+), rdma-demo-1 (\S+)", out)
    assert [r[0] for r in rows] == [f"bond{i}" for i in range(BONDS)], out[-8000:]
    got = {}
    for bond, subnet, node, a, b in rows:
        net = ipaddress.ip_network(subnet)
        assert a != b and node not in (a, b), (bond, node, a, b)
        assert all(ipaddress.ip_address(x) in net for x in (node, a, b)), (bond, subnet, a, b)
        got[bond] = [a, b]
    return got


def _gid_indexes(out: str, addresses: dict[str, list[str]]) -> None:
    """Each pod address has its own RoCE v2 GID index, not the host's 3, and device-info carries it."""
    rows = re.findall(
        r"-> pod rdma-demo-(\d) (bond\d): RoCE v2 GID of (\S+) at index (\d+) .*\"gid-index\": (\d+)", out
    )
    assert len(rows) == 2 * BONDS, out[-8000:]
    per_bond: dict[str, set[int]] = {}
    for pod, bond, ip, index, info_index in rows:
        assert addresses[bond][int(pod)] == ip
        assert index == info_index and int(index) != 3
        per_bond.setdefault(bond, set()).add(int(index))
    assert all(len(indexes) == 2 for indexes in per_bond.values()), per_bond


@pytest.mark.netns
def test_ctrl_c_while_the_pods_run_removes_everything() -> None:
    _skip_unless_possible()
    proc = subprocess.Popen(
        DEMO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=REPO,
        preexec_fn=_as_from_a_terminal,
    )
    try:
        seen = _read_until(proc, "=== 4.")  # both pods are up, the device plugin serves
        pid = run_pid(seen)
        assert any("-pod1" in x for x in leftovers(pid)), "the second pod's netns should exist now"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, rest
    assert "demo interrupted" in rest and "cleaned up" in rest
    assert leftovers(pid) == []


def _read_until(proc: subprocess.Popen[str], marker: str, timeout: float = 300) -> str:
    assert proc.stdout is not None
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        if marker in line:
            return "".join(out)
    raise AssertionError(f"demo never printed {marker!r}:\n{''.join(out)[-3000:]}")


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ([], ("vpc-cni", "exclusive")),
        (["global-router"], ("global-router", "exclusive")),
        (["shared"], ("vpc-cni", "shared")),
        (["shared", "global-router"], ("global-router", "shared")),
        (["exclusive", "exclusive"], ("vpc-cni", "exclusive")),
    ],
)
def test_mode_names_the_cluster_network_and_the_rdma_mode(given: list[str], want: tuple[str, str]) -> None:
    import argparse

    assert command._modes(argparse.ArgumentParser(), given) == want


@pytest.mark.parametrize("given", [["shared", "exclusive"], ["vpc-cni", "global-router"]])
def test_two_modes_of_one_kind_are_refused(given: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    with pytest.raises(SystemExit) as exc:
        command._modes(argparse.ArgumentParser(prog="scripts/demo"), given)
    assert exc.value.code == 2
    assert "one cluster network mode and one RDMA mode at most" in capsys.readouterr().err


def _as_from_a_terminal() -> None:
    """The demo's SIGINT as a terminal's foreground job has it (default): a suite started by a
    shell's ``cmd &`` inherits SIGINT ignored, passed it on, and the Ctrl-C below went unheard."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
