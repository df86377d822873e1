"""An RDMA port's counters as the kernel exports them, read fresh on every call.

Two directories under ``class/infiniband/<device>/ports/<port>/`` (Documentation/ABI/stable/
sysfs-class-infiniband): ``counters/`` holds the InfiniBand PMA counters (``port_xmit_data``,
``port_rcv_data``, ... - the data counters count 4-octet words), and ``hw_counters/`` the driver's
own (mlx5: ``out_of_sequence``, ``packet_seq_err``, ``np_cnp_sent``, ``rp_cnp_handled``…; rxe:
``rcvd_seq_err``, ``sent_pkts``…). Which files exist depends on the driver and its firmware, so
nothing here names them: every regular file whose content is an integer is a counter, named after
the file. Nothing is cached, as a scrape must see the value of now: a port's read is one
``open``/``read`` per file (~30-60 files).
"""

from __future__ import annotations

import os

from rdma_cni.rdma.sysfs import port_dir

KINDS = ("counters", "hw_counters")


def read_counters(sysfs_root: str, device: str, port: int) -> dict[str, dict[str, int]]:
    """``{"counters": {name: value}, "hw_counters": {...}}``; a directory the device lacks is left
    out, and a file that does not read as an integer (some drivers fail a read with EINVAL while a
    counter is unsupported) is skipped."""
    out: dict[str, dict[str, int]] = {}
    base = port_dir(sysfs_root, device, port)
    for kind in KINDS:
        values = _read_dir(os.path.join(base, kind))
        if values is not None:
            out[kind] = values
    return out


def _read_dir(path: str) -> dict[str, int] | None:
    try:
        names = sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return None
    values: dict[str, int] = {}
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            value = _read_int(dfd, name)
            if value is not None:
                values[name] = value
    finally:
        os.close(dfd)
    return values


def _read_int(dfd: int, name: str) -> int | None:
    try:
        fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
    except OSError:  # vanished, or a subdirectory we cannot open as a file
        return None
    try:
        text = os.read(fd, 64).strip()
    except OSError:  # EINVAL/EOPNOTSUPP: the driver does not support this counter now
        return None
    finally:
        os.close(fd)
    try:
        return int(text)
    except ValueError:
        return None
