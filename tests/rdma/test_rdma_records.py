"""GID records: paths from validated IDs, atomic writes, permissions, host.json kept current."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rdma_cni.cni.errors import INVALID_ENV, CniError
from rdma_cni.rdma import records, sysfs
from rdma_cni.rdma.sysfs import GidEntry
from rdma_cni.sim.tree import SimBond, build_tree, clear_slot, write_slot

ENTRY = GidEntry("mlx5_bond_0", 1, 1, "::ffff:198.51.100.2", "RoCE v2", "bond0", "198.51.100.2")


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_pod_record_content_and_permissions(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    path = records.write_pod_record(run, "abc123", "net1", ENTRY, uverbs="uverbs0")
    assert path == os.path.join(run, "gid", "abc123", "net1.json")
    data = json.loads(Path(path).read_text())
    assert data == {
        "containerId": "abc123",
        "ifname": "net1",
        "device": "mlx5_bond_0",
        "port": 1,
        "gidIndex": 1,
        "gid": "::ffff:198.51.100.2",
        "type": "RoCE v2",
        "netdev": "bond0",
        "ipv4": "198.51.100.2",
        "uverbs": "/dev/infiniband/uverbs0",
    }
    assert mode_of(path) == 0o644
    assert mode_of(os.path.dirname(path)) == 0o755
    assert mode_of(os.path.join(run, "gid")) == 0o755
    assert records.read_pod_record(run, "abc123", "net1") == data
    assert [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".tmp")] == []


@pytest.mark.parametrize("cid", ["../x", "..", "a/b", "", "-x", "x y"])
def test_bad_container_ids_never_reach_the_filesystem(tmp_path: Path, cid: str) -> None:
    with pytest.raises(CniError):
        records.write_pod_record(str(tmp_path), cid, "net1", ENTRY)
    with pytest.raises(CniError):
        records.remove_pod_records(str(tmp_path), cid)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("ifname", ["../x", "a/b", "waytoolonginterface0", ".."])
def test_bad_ifnames_are_refused(tmp_path: Path, ifname: str) -> None:
    with pytest.raises(CniError) as e:
        records.write_pod_record(str(tmp_path), "abc", ifname, ENTRY)
    assert e.value.code == INVALID_ENV
    assert list(tmp_path.iterdir()) == []


def test_remove_one_interface_then_all_and_repeat(tmp_path: Path) -> None:
    run = str(tmp_path)
    records.write_pod_record(run, "c1", "net1", ENTRY)
    records.write_pod_record(run, "c1", "net2", ENTRY)
    records.write_pod_record(run, "c2", "net1", ENTRY)
    assert records.list_pod_records(run) == {"c1": ["net1", "net2"], "c2": ["net1"]}
    assert records.remove_pod_records(run, "c1", "net1") == [os.path.join(run, "gid", "c1", "net1.json")]
    assert records.list_pod_records(run) == {"c1": ["net2"], "c2": ["net1"]}
    assert len(records.remove_pod_records(run, "c1")) == 1
    assert not os.path.exists(os.path.join(run, "gid", "c1"))
    assert records.remove_pod_records(run, "c1") == []  # idempotent
    assert records.remove_pod_records(run, "c1", "net1") == []
    assert records.list_pod_records(run) == {"c2": ["net1"]}


def test_torn_record_reads_as_absent(tmp_path: Path) -> None:
    path = records.write_pod_record(str(tmp_path), "c1", "net1", ENTRY)
    Path(path).write_text('{"device": ')
    assert records.read_pod_record(str(tmp_path), "c1", "net1") is None


WRITER = """
import sys
from rdma_cni.rdma import records
from rdma_cni.rdma.sysfs import GidEntry
run, n = sys.argv[1], 0
while True:
    n += 1
    e = GidEntry("mlx5_bond_0", 1, n % 1000, "::ffff:198.51.100.2", "RoCE v2", "bond0", "198.51.100.2")
    records.write_pod_record(run, "c1", "net1", e)
    if n == 1:
        print("ready", flush=True)
"""


def test_record_is_never_torn_when_the_writer_is_killed(tmp_path: Path) -> None:
    """kill -9 a process rewriting the record in a loop: the file is always whole JSON."""
    run = str(tmp_path)
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, run], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        data = records.read_pod_record(run, "c1", "net1")
        assert data is not None and data["device"] == "mlx5_bond_0"


def test_host_record_tracks_the_host_index_and_keeps_it_while_the_ip_is_in_a_pod(tmp_path: Path) -> None:
    root = build_tree(
        str(tmp_path / "sys"), [SimBond("bond0", "mlx5_bond_0"), SimBond("bond1", "mlx5_bond_1")], 16
    )
    run = str(tmp_path / "run")
    gid0, gid1 = sysfs.gid_for_ip("198.51.100.2"), sysfs.gid_for_ip("198.51.100.18")
    write_slot(root, "mlx5_bond_0", 1, 1, gid0, "bond0")
    write_slot(root, "mlx5_bond_1", 1, 1, gid1, "bond1")
    rec = records.update_host_record(run, root)
    path = os.path.join(run, "gid", "host.json")
    assert json.loads(Path(path).read_text()) == rec
    assert mode_of(path) == 0o644
    ports = {p["device"]: p for p in rec["ports"]}
    assert (ports["mlx5_bond_0"]["gidIndex"], ports["mlx5_bond_0"]["ipv4"]) == (1, "198.51.100.2")
    assert ports["mlx5_bond_0"]["present"] is True
    assert ports["mlx5_bond_0"]["uverbs"] == "/dev/infiniband/uverbs0"
    assert ports["mlx5_bond_1"]["gidIndex"] == 1
    # The IP moves into a pod interface named net1: the host has no IPv4 GID, the index is kept.
    clear_slot(root, "mlx5_bond_0", 1, 1)
    write_slot(root, "mlx5_bond_0", 1, 1, gid0, "net1")
    ports = {p["device"]: p for p in records.update_host_record(run, root)["ports"]}
    assert ports["mlx5_bond_0"]["gidIndex"] == 1 and ports["mlx5_bond_0"]["present"] is False
    assert ports["mlx5_bond_0"]["gids"] == []


def test_a_refresh_scans_only_the_ports_whose_addresses_or_slots_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every verb refreshes host.json; a port whose bond holds the addresses its entry recorded, each
    GID still in its recorded slot, keeps its entry without a scan of its table (and an unchanged
    record is not written again). What changed is scanned as before."""
    root = build_tree(
        str(tmp_path / "sys"), [SimBond("bond0", "mlx5_bond_0"), SimBond("bond1", "mlx5_bond_1")], 16
    )
    run = str(tmp_path / "run")
    ip0, ip1, ip6 = "198.51.100.2", "198.51.100.18", "2001:db8:1::18"
    write_slot(root, "mlx5_bond_0", 1, 1, sysfs.gid_for_ip(ip0), "bond0")
    write_slot(root, "mlx5_bond_1", 1, 1, sysfs.gid_for_ip(ip1), "bond1")
    write_slot(root, "mlx5_bond_1", 1, 2, sysfs.gid_bytes(ip6), "bond1")
    v4 = {"bond0": [ip0], "bond1": [ip1]}
    v6 = {"bond0": ["fe80::1"], "bond1": ["fe80::2", ip6]}
    first = records.update_host_record(run, root, v4, v6)
    scanned: list[str] = []
    read_gids = sysfs.read_gids

    def spy(sysfs_root: str, device: str, port: int) -> list[GidEntry]:
        scanned.append(device)
        return read_gids(sysfs_root, device, port)

    monkeypatch.setattr(sysfs, "read_gids", spy)
    path = Path(run, "gid", "host.json")
    written = path.stat().st_ino

    assert records.update_host_record(run, root, v4, v6) == first
    assert scanned == [] and path.stat().st_ino == written, "nothing changed: no scan, no write"

    # bond0's address moves to a pod (a verb on bond0): only bond0's table is read
    clear_slot(root, "mlx5_bond_0", 1, 1)
    write_slot(root, "mlx5_bond_0", 1, 1, sysfs.gid_for_ip(ip0), "net1")
    ports = {p["device"]: p for p in records.update_host_record(run, root, {**v4, "bond0": []}, v6)["ports"]}
    assert scanned == ["mlx5_bond_0"]
    assert (ports["mlx5_bond_0"]["gidIndex"], ports["mlx5_bond_0"]["present"]) == (1, False)
    assert ports["mlx5_bond_1"] == {p["device"]: p for p in first["ports"]}["mlx5_bond_1"]

    # bond1 keeps its addresses but its IPv4 GID is no longer where the entry says: scanned again
    scanned.clear()
    clear_slot(root, "mlx5_bond_1", 1, 1)
    write_slot(root, "mlx5_bond_1", 1, 3, sysfs.gid_for_ip(ip1), "bond1")
    ports = {p["device"]: p for p in records.update_host_record(run, root, {**v4, "bond0": []}, v6)["ports"]}
    assert scanned == ["mlx5_bond_1"] and ports["mlx5_bond_1"]["gidIndex"] == 3

    # bond1's first global IPv6 is now another one: scanned again, and it follows
    scanned.clear()
    other6 = "2001:db8:1::99"
    write_slot(root, "mlx5_bond_1", 1, 4, sysfs.gid_bytes(other6), "bond1")
    v6 = {**v6, "bond1": [other6, ip6]}
    ports = {p["device"]: p for p in records.update_host_record(run, root, {**v4, "bond0": []}, v6)["ports"]}
    assert scanned == ["mlx5_bond_1"]
    assert (ports["mlx5_bond_1"]["gidIndexIPv6"], ports["mlx5_bond_1"]["ipv6"]) == (4, other6)

    # without the host's addresses (a caller that cannot tell) every port is scanned, as before
    scanned.clear()
    records.update_host_record(run, root)
    assert sorted(scanned) == ["mlx5_bond_0", "mlx5_bond_1"]


def test_host_record_without_any_ipv4_gid_has_no_index(tmp_path: Path) -> None:
    root = build_tree(str(tmp_path / "sys"), [SimBond("bond0", "mlx5_bond_0")], 8)
    rec = records.update_host_record(str(tmp_path / "run"), root)
    assert rec["ports"][0]["gidIndex"] is None


HOLD_HOST_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""

UPDATE = """
import sys
from rdma_cni.rdma import records
records.update_host_record(sys.argv[1], sys.argv[2])
print("updated", flush=True)
"""


def test_host_record_updates_wait_for_each_other(tmp_path: Path) -> None:
    """ADDs refresh host.json outside the node lock: its read-modify-write (which keeps the index of
    an IP another ADD moved) takes a lock of its own, so two refreshes never interleave."""
    root = build_tree(str(tmp_path / "sys"), [SimBond("bond0", "mlx5_bond_0")], 8)
    run = str(tmp_path / "run")
    records.update_host_record(run, root)
    lock = os.path.join(run, "gid", records.HOST_LOCK)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_HOST_LOCK, lock], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        updater = subprocess.Popen([sys.executable, "-c", UPDATE, run, root], stdout=subprocess.PIPE)
        with pytest.raises(subprocess.TimeoutExpired):
            updater.communicate(timeout=1.0)  # blocked on the lock
        assert holder.stdin is not None
        holder.stdin.write(b"\n")
        holder.stdin.flush()
        out, _ = updater.communicate(timeout=20)
        assert out == b"updated\n" and updater.returncode == 0
    finally:
        holder.kill()
        holder.wait()
