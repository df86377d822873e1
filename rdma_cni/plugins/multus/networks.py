"""The pod's network request: the annotation that names the extra networks a pod joins.

Two forms, as Multus reads ``k8s.v1.cni.cncf.io/networks`` and TKE reads
``tke.cloud.tencent.com/networks``:

* a comma list ``[namespace/]name[@ifname]``, e.g. ``tke-route-eni,tke-rdma-macvlan`` or
  ``kube-system/tke-rdma-macvlan@rdma0``;
* a JSON list ``[{"name", "namespace", "interface", "mac", "ips", "deviceID", "cni-args"}]``.

Names and namespaces are DNS-1123 labels (what Kubernetes allows for object names of this kind), so
a name can never smuggle a path or a shell word into a file lookup. Errors name the annotation, the
entry and the fix; they are config errors (7), raised before any delegate runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.cni.errors import INVALID_CONFIG, CniError

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
IFNAME_RE = re.compile(r"^[^/:\s]{1,15}$")
MAC_RE = re.compile(r"^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$")
JSON_KEYS = frozenset({"name", "namespace", "interface", "mac", "ips", "deviceID", "cni-args"})


@dataclass(frozen=True)
class NetworkSelection:
    """One network the pod asked for, and what it asked for on it."""

    name: str
    namespace: str = ""
    interface: str = ""
    mac: str = ""
    ips: tuple[str, ...] = ()
    device_id: str = ""
    cni_args: dict[str, Any] = field(default_factory=dict)


def parse_annotation(text: str, annotation: str = "networks annotation") -> list[NetworkSelection]:
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        selections = _parse_json(text, annotation)
    else:
        selections = [_parse_short(part.strip(), annotation) for part in text.split(",") if part.strip()]
    seen: set[str] = set()
    for sel in selections:
        if sel.interface and sel.interface in seen:
            raise _fail(annotation, sel.name, f"interface {sel.interface!r} is requested twice")
        if sel.interface:
            seen.add(sel.interface)
    return selections


def _fail(annotation: str, entry: str, problem: str) -> CniError:
    return CniError(INVALID_CONFIG, f"pod annotation {annotation}: entry {entry!r}: {problem}")


def _parse_short(part: str, annotation: str) -> NetworkSelection:
    ref, _, ifname = part.partition("@")
    namespace, slash, name = ref.rpartition("/")
    if slash and not namespace:
        raise _fail(annotation, part, "empty namespace before '/'; write name or namespace/name")
    if "@" in part and not ifname:
        raise _fail(annotation, part, "empty interface name after '@'")
    return _checked(NetworkSelection(name=name, namespace=namespace, interface=ifname), annotation, part)


def _parse_json(text: str, annotation: str) -> list[NetworkSelection]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CniError(INVALID_CONFIG, f"pod annotation {annotation} is not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise CniError(
            INVALID_CONFIG, f"pod annotation {annotation}: the JSON form must be a list of objects"
        )
    return [_from_object(item, annotation, i) for i, item in enumerate(data)]


def _from_object(item: Any, annotation: str, index: int) -> NetworkSelection:
    label = f"#{index}"
    if not isinstance(item, dict):
        raise _fail(annotation, label, "must be a JSON object with at least 'name'")
    label = str(item.get("name", label))
    for key in ("name", "namespace", "interface", "mac", "deviceID"):
        if key in item and not isinstance(item[key], str):
            raise _fail(annotation, label, f"'{key}' must be a string")
    ips = item.get("ips", [])
    if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
        raise _fail(annotation, label, "'ips' must be a list of CIDR strings")
    cni_args = item.get("cni-args", {})
    if not isinstance(cni_args, dict):
        raise _fail(annotation, label, "'cni-args' must be a JSON object")
    sel = NetworkSelection(
        name=item.get("name", ""),
        namespace=item.get("namespace", ""),
        interface=item.get("interface", ""),
        mac=item.get("mac", ""),
        ips=tuple(ips),
        device_id=item.get("deviceID", ""),
        cni_args=dict(cni_args),
    )
    return _checked(sel, annotation, label)


def _checked(sel: NetworkSelection, annotation: str, entry: str) -> NetworkSelection:
    if not sel.name:
        raise _fail(annotation, entry, "network name is missing")
    if not _is_label(sel.name):
        raise _fail(annotation, entry, f"network name {sel.name!r} is not a DNS-1123 label ([a-z0-9-], ≤63)")
    if sel.namespace and not _is_label(sel.namespace):
        raise _fail(annotation, entry, f"namespace {sel.namespace!r} is not a DNS-1123 label")
    if sel.interface and (not IFNAME_RE.match(sel.interface) or sel.interface in (".", "..")):
        raise _fail(
            annotation, entry, f"interface {sel.interface!r} is not a valid name (≤15 chars, no / : space)"
        )
    if sel.mac and not MAC_RE.match(sel.mac):
        raise _fail(annotation, entry, f"mac {sel.mac!r} is not a MAC address like 02:00:00:00:00:01")
    return sel


def _is_label(value: str) -> bool:
    return len(value) <= 63 and bool(DNS1123_LABEL.match(value))
