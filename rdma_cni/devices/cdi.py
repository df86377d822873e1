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
- A writer that owns its kind outright (the device plugin: one spec per pool, the pool's resource
  name as the kind) names devices as it likes (:func:`named_document`) and writes through the same
  atomic :func:`write_document`; :func:`kind_problem` / :func:`name_problem` say in words why the CDI
  library would refuse a kind or a device name (its ``pkg/parser`` rules).

    ids = write_spec("/var/run/cdi", KIND, uid, alloc, bonds)
    remove_spec("/var/run/cdi", KIND, uid)
    write_document("/var/run/cdi", "vendor.example/pool", "owner", named_document(...))
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
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
    return named_document(kind, {f"{owner}-{dev}": nodes for dev, nodes in per_device.items()}, common, env)


def named_document(kind: str, named: Mapping[str, Sequence[DeviceSpec]], common: Sequence[DeviceSpec],
                   env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The spec of ``kind``: one device per entry of ``named`` (its name as given, its nodes), and
    ``common`` nodes and ``env`` as the spec's own edits (the runtime applies them once per container
    whichever of the spec's devices it gets)."""
    edits: dict[str, Any] = {}
    if env:
        edits["env"] = [f"{k}={v}" for k, v in sorted(env.items())]
    if common:
        edits["deviceNodes"] = [_node(s) for s in common]
    doc: dict[str, Any] = {
        "cdiVersion": VERSION,
        "kind": kind,
        "devices": [
            {"name": name, "containerEdits": {"deviceNodes": [_node(s) for s in nodes]}}
            for name, nodes in named.items()
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
    write_document(spec_dir, kind, owner, spec_document(kind, owner, per, common, alloc.envs))
    return device_ids(kind, owner, per)


def write_document(spec_dir: str, kind: str, owner: str, doc: Mapping[str, Any]) -> str:
    """Write ``doc`` as the spec of ``owner`` in one rename (the runtime never reads half a spec); its
    path."""
    path = spec_path(spec_dir, kind, owner)
    # 0644: the runtime reads it (as root anyway); the dir is the runtime's well-known one.
    durable.atomic_write(path, json.dumps(doc, indent=None).encode() + b"\n", mode=0o644, dir_mode=0o755)
    return path


def owner_specs(spec_dir: str, owner: str) -> list[str]:
    """The spec files of ``owner`` in ``spec_dir``, of any kind (``*_<owner>.json``), sorted."""
    return sorted(glob.glob(os.path.join(glob.escape(spec_dir), f"*_{glob.escape(owner)}.json")))


def read_document(path: str) -> dict[str, Any] | None:
    """The JSON object in spec file ``path``; None when there is none or it is not one."""
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def read_kind(path: str) -> str | None:
    """The ``kind`` a spec file declares; None when it cannot be read as a spec."""
    kind = (read_document(path) or {}).get("kind")
    return kind if isinstance(kind, str) else None


# The CDI library's own rules (tags.cncf.io/container-device-interface pkg/parser, v1.1.1): a vendor
# or class starts with a letter, ends with a letter or digit, and holds letters, digits, ``_-.``; a
# device name may also start with a digit and hold ``:``.
_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


def kind_problem(kind: str) -> str | None:
    """Why the CDI library would refuse ``kind`` (``vendor/class``), in words; None when it is valid."""
    vendor, sep, cls = kind.partition("/")
    if not sep or "/" in cls:
        return "a CDI kind is vendor/class (one '/')"
    for part, what in ((vendor, "vendor"), (cls, "class")):
        if not _VENDOR_OR_CLASS.fullmatch(part):
            return (f"the CDI {what} {part!r} must start with a letter, end with a letter or digit "
                    "and hold only letters, digits, '_', '-' and '.'")
    return None


def name_problem(name: str) -> str | None:
    """Why the CDI library would refuse device name ``name``, in words; None when it is valid."""
    if _DEVICE_NAME.fullmatch(name):
        return None
    return (f"the CDI device name {name!r} must start and end with a letter or digit and hold only "
            "letters, digits, '_', '-', '.' and ':'")


def remove_spec(spec_dir: str, kind: str, owner: str) -> bool:
    """Remove the spec of ``owner``; False when there was none."""
    with contextlib.suppress(FileNotFoundError):
        return durable.remove(spec_path(spec_dir, kind, owner))
    return False
