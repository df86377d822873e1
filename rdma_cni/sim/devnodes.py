"""``/dev/infiniband`` for a simulated node: real character device nodes made with ``mknod``.

udev makes ``/dev/infiniband/<name>`` from each RDMA char device's sysfs ``dev`` attribute
(``MAJOR:MINOR``); this does the same from a tree built by :mod:`rdma_cni.sim.tree`, under any dev
root, so the device plugin checks and hands out real nodes with the kernel's numbers (uverbsN
231:192+N, umadN 231:N, issmN 231:64+N, rdma_cm 10:<misc minor>). Nothing opens them: this machine
has no ib_uverbs, and a node on a ``nodev`` mount could not be opened anyway. Needs CAP_MKNOD.

Usage::

    make_dev_nodes("/tmp/sys", "/tmp/dev")      # ["uverbs0", "umad0", "issm0", "rdma_cm"]
    remove_dev_node("/tmp/dev", "uverbs0")      # the plugin must now call mlx5_bond_0 unhealthy
"""

from __future__ import annotations

import os
import stat

# class dirs whose entries are char devices under /dev/infiniband (rdma_cm: only that misc entry)
CLASSES = (("infiniband_verbs", "uverbs"), ("infiniband_mad", "umad"), ("infiniband_mad", "issm"),
           ("misc", "rdma_cm"))


def _dev_numbers(path: str) -> tuple[int, int] | None:
    try:
        with open(path) as f:
            major, minor = f.read().strip().split(":")
        return int(major), int(minor)
    except (OSError, ValueError):
        return None


def char_devices(sysfs_root: str) -> dict[str, tuple[int, int]]:
    """name -> (major, minor) of every RDMA char device the tree announces."""
    out: dict[str, tuple[int, int]] = {}
    for cls, prefix in CLASSES:
        base = os.path.join(sysfs_root, "class", cls)
        try:
            names = sorted(os.listdir(base))
        except FileNotFoundError:
            continue
        for name in names:
            if not name.startswith(prefix):
                continue
            numbers = _dev_numbers(os.path.join(base, name, "dev"))
            if numbers is not None:
                out[name] = numbers
    return out


def make_dev_node(dev_root: str, name: str, major: int, minor: int, mode: int = 0o666) -> str:
    """``<dev_root>/infiniband/<name>`` as a char device (replaced if it is anything else)."""
    directory = os.path.join(dev_root, "infiniband")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor):
            return path
        os.unlink(path)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod's mode is filtered by the umask; udev's rules give 0666
    return path


def make_dev_nodes(sysfs_root: str, dev_root: str) -> list[str]:
    """Every node the tree announces; returns the names made."""
    made = []
    for name, (major, minor) in char_devices(sysfs_root).items():
        make_dev_node(dev_root, name, major, minor)
        made.append(name)
    return made


def remove_dev_node(dev_root: str, name: str) -> bool:
    try:
        os.unlink(os.path.join(dev_root, "infiniband", name))
    except FileNotFoundError:
        return False
    return True
