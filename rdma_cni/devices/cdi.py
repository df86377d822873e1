"""CDI (Container Device Interface) specs: what a container gets, as a file the runtime reads.

The DRA driver answers NodePrepareResources with CDI device IDs (``vendor/class=name``), and the
runtime (containerd >= 2.0 by default, 1.7 with ``enable_cdi``) looks them up in the spec files under
``/var/run/cdi``. What goes in is exactly what the device plugin's Allocate answers
(:func:`rdma_cni.devices.allocation.allocate`): this module only lays that answer out.

- One spec file per owner (a claim's UID): ``<vendor>-<class>_<owner>.json``, written atomically
  (temp file + rename, :mod:`rdma_cni.durable`), so the runtime never reads half a spec.
- Each bond is one CDI device holding its own nodes (``uverbsN``, ``umadN``/``issmN``); the nodes every
  bond shares (``rdma_cm``) and the env (``NCCL_IB_HCA``, ``UCX_NET_DEVICES``, ``NCCL_IB_GID_INDEX``)
  are the spec's own edits, which the runtime applies once whichever of its devices a container gets.
- ``cdiVersion`` 0.6.0: device nodes with ``hostPath`` need 0.5.0; containerd 2.4.2 vendors
  tags.cncf.io/container-device-interface v1.1.1, which reads 0.3.0 to 1.1.0 (``specs-go/version.go``).
- Device names carry the owner (``<uid>-mlx5_bond_0``): a CDI name must be unique across all specs of
  the kind, and in shared mode two claims hold the same bond.

    ids = write_spec("/var/run/cdi", KIND, uid, {"mlx5_bond_0": alloc_nodes}, common_nodes, env)
    remove_spec("/var/run/cdi", KIND, uid)
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rdma_cni import durable
from rdma_cni.devices.allocation import RDMA_CM, ContainerAllocation, DeviceSpec
from rdma_cni.devices.model import RdmaBond

VERSION = "0.6.0"
SPEC_DIR = "/var/run/cdi"


def qualified(kind: str, name: str) -> str:
    """``vendor/class`` + ``name`` -> the CDI device ID the runtime resolves."""
    return f"{kind}={name}"


def spec_path(spec_dir: str, kind: str, owner: str) -> str:
    """``<spec_dir>/<vendor>-<class>_<owner>.json`` (the name CDI's own tools give a transient spec)."""
    return os.path.join(spec_dir, f"{kind.replace('/', '-')}_{owner}.json")


def _node(spec: DeviceSpec) -> dict[str, Any]:
    # No type/major/minor: the runtime reads them from hostPath, so a node re-created by udev with
    # new numbers is still right.
    return {"path": spec.container_path, "hostPath": spec.host_path, "permissions": spec.permissions}


def split_by_bond(alloc: ContainerAllocation, bonds: Sequence[RdmaBond]) -> tuple[
        dict[str, list[DeviceSpec]], list[DeviceSpec]]:
    """The nodes of ``alloc`` per bond (by the char device names the model gave the bond) and those of
    no one bond (``rdma_cm``)."""
    owner = {n: b.id for b in bonds for n in (b.uverbs, *b.umad, *b.issm) if n}
    per: dict[str, list[DeviceSpec]] = {b.id: [] for b in bonds}
    common: list[DeviceSpec] = []
    for spec in alloc.devices:
        name = os.path.basename(spec.container_path)
        if name in owner and name != RDMA_CM:
            per[owner[name]].append(spec)
        else:
            common.append(spec)
    return per, common


def spec_document(kind: str, owner: str, per_device: Mapping[str, Sequence[DeviceSpec]],
                  common: Sequence[DeviceSpec], env: Mapping[str, str]) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    if env:
        edits["env"] = [f"{k}={v}" for k, v in sorted(env.items())]
    if common:
        edits["deviceNodes"] = [_node(s) for s in common]
    doc: dict[str, Any] = {
        "cdiVersion": VERSION,
        "kind": kind,
        "devices": [
            {"name": f"{owner}-{dev}", "containerEdits": {"deviceNodes": [_node(s) for s in nodes]}}
            for dev, nodes in per_device.items()
        ],
    }
    if edits:
        doc["containerEdits"] = edits
    return doc


def device_ids(kind: str, owner: str, per_device: Mapping[str, Sequence[DeviceSpec]]) -> dict[str, str]:
    """device -> its CDI ID in the spec of ``owner``."""
    return {dev: qualified(kind, f"{owner}-{dev}") for dev in per_device}


def write_spec(spec_dir: str, kind: str, owner: str, alloc: ContainerAllocation,
               bonds: Sequence[RdmaBond]) -> dict[str, str]:
    """Write the spec of ``owner`` holding ``alloc`` (the model's answer for ``bonds``), replacing any
    earlier one in one rename; the CDI ID of each bond."""
    per, common = split_by_bond(alloc, bonds)
    doc = spec_document(kind, owner, per, common, alloc.envs)
    # 0644: the runtime reads it (as root anyway); the dir is the runtime's well-known one.
    durable.atomic_write(spec_path(spec_dir, kind, owner), json.dumps(doc, indent=None).encode() + b"\n",
                         mode=0o644, dir_mode=0o755)
    return device_ids(kind, owner, per)


def remove_spec(spec_dir: str, kind: str, owner: str) -> bool:
    """Remove the spec of ``owner``; False when there was none."""
    with contextlib.suppress(FileNotFoundError):
        return durable.remove(spec_path(spec_dir, kind, owner))
    return False
