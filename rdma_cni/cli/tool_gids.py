"""``cni-tool gids [DEVICE]``: the ``show_gids`` table (DEV PORT INDEX GID IPv4 VER DEV) from sysfs.

Run on the node, or with ``--netns PATH`` as a pod sees it (sysfs mounted inside that netns). The GID
index is what ``NCCL_IB_GID_INDEX`` must be set to: the RoCE v2 row of the pod's IPv4 address.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from rdma_cni.cni.errors import CniError
from rdma_cni.rdma import sysfs
from rdma_cni.rdma.podview import read_in_netns
from rdma_cni.rdma.sysfs import GidEntry

HEADER = ("DEV", "PORT", "INDEX", "GID", "IPv4", "VER", "DEV")
VERSIONS = {sysfs.ROCE_V2: "v2", sysfs.ROCE_V1: "v1", sysfs.IB: "IB"}


def collect(sysfs_root: str, device: str | None) -> list[dict[str, object]]:
    """Every non-empty GID of every port (of ``device`` only, when given), as plain dicts."""
    devices = sysfs.list_devices(sysfs_root)
    if device is not None:
        devices = [d for d in devices if d == device]
    out: list[dict[str, object]] = []
    for port in sysfs.list_ports(sysfs_root):
        if port.device in devices:
            out += [asdict(e) for e in sysfs.read_gids(sysfs_root, port.device, port.port)]
    return out


def render(entries: list[GidEntry]) -> str:
    rows = [HEADER, tuple("-" * len(h) for h in HEADER)]
    for e in entries:
        rows.append(
            (e.device, str(e.port), str(e.index), e.raw, e.ipv4 or "", VERSIONS.get(e.type, e.type), e.ndev)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join([*lines, f"n_gids_found={len(entries)}"])


@click.command("gids")
@click.argument("device", required=False)
@click.option("--sysfs-root", default="/sys", show_default=True, help="where class/infiniband is read")
@click.option("--netns", "netns", default=None, help="show the table as seen inside this netns (path)")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of the table")
def gids(device: str | None, sysfs_root: str, netns: str | None, as_json: bool) -> None:
    """Show RDMA GID tables like show_gids (use the RoCE v2 IPv4 row's INDEX for NCCL_IB_GID_INDEX)."""
    try:
        if netns:
            raw = read_in_netns(netns, lambda root: collect(root, device), sysfs_root)
        else:
            raw = collect(sysfs_root, device)
    except OSError as e:
        raise click.ClickException(str(e)) from None
    except CniError as e:  # the netns path is missing or not a netns: one sentence, no traceback
        raise click.ClickException(e.msg) from None
    entries = [GidEntry(**r) for r in raw]
    if device is not None and not entries and device not in _devices(sysfs_root, netns):
        raise click.ClickException(f"no RDMA device {device} under {sysfs_root}/class/infiniband")
    if as_json:
        click.echo(json.dumps([asdict(e) for e in entries], indent=1))
    else:
        click.echo(render(entries))


def _devices(sysfs_root: str, netns: str | None) -> list[str]:
    if netns:
        devs = read_in_netns(netns, sysfs.list_devices, sysfs_root)
        return [str(d) for d in devs]
    return sysfs.list_devices(sysfs_root)
