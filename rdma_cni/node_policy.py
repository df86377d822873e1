"""The node's policy: what the node's admin fixed, which no network config may widen.

A plugin's stdin may come from a node file the installer wrote, or from a NetworkAttachmentDefinition
a namespace user wrote (upstream Multus, rdma-multus's NAD lookup): the plugin cannot tell them
apart. So the node keeps one file of its own, written by the installer from the chart's values
(``/etc/rdma-cni/node-policy.json``), and every config is read through it:

- a key that names a host or kubelet path (``dataDir``, ``runDir``, ``sysfsRoot``, ``logFile``,
  ``kubeletRootDir`` ...) takes the node's value when the config leaves it out, and a config that
  gives another value is refused (error 7 naming the key and this file);
- ``masters`` may only name the node's bonds (``bonds``; by default the netdevs that back its RDMA
  devices), and ``rdma.required: false``, ``rdma.netnsMode`` and ``ipam`` only what the node allows;
- a Kubernetes pod gets only the bonds kubelet allocated to it (``bondsFrom: kubelet``);
- rdma-multus reads NADs only from the pod's own namespace and ``globalNamespaces``, and only with
  the delegate types the node allows.

DEL and GC never refuse: they read the node's paths whatever the config says (a config refused at
ADD has nothing to give back, and a pod must never be stuck terminating on it).

``trust: configs`` is the admin's explicit choice for a node where only the cluster admin writes
network configs and annotations (a lab, ``cni-tool`` debugging with other paths): the configs
decide, as they did before this file existed. No file at all means the defaults below, with
``trust: node``.

    policy = load(req.env)
    raw = policy.narrow(req.config, "rdma-macvlan")          # ADD/CHECK/STATUS: refuse a widening
    raw = policy.narrow(req.config, "rdma-macvlan", cleanup=True)   # DEL/GC: node paths, no refusal
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.cni.errors import INVALID_CONFIG, CniError, ConfigKeyError

log = logging.getLogger("rdma_cni.policy")

POLICY_ENV = "RDMA_CNI_NODE_POLICY"  # the runtime's environment (never a tenant's): another file
DEFAULT_PATH = "/etc/rdma-cni/node-policy.json"
TRUST_NODE, TRUST_CONFIGS = "node", "configs"
BONDS_FROM_KUBELET, BONDS_FROM_CONFIG = "kubelet", "config"
PLUGINS = ("rdma-macvlan", "rdma-ipvlan", "rdma-multus")
LOG_FILE = "/var/log/rdma-cni/rdma-cni.log"
RDMA_RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"

# Every key that names a host or kubelet path, per plugin, with the node's default. A config that
# gives one of these may only repeat the node's value (``logFile`` may also be "": stderr only).
DEFAULT_PATHS: dict[str, dict[str, Any]] = {
    "rdma-macvlan": {
        "dataDir": "/var/lib/cni/rdma-macvlan", "runDir": "/run/rdma-cni", "sysfsRoot": "/sys",
        "logFile": LOG_FILE, "kubeletRootDir": "/var/lib/kubelet", "podResourcesDir": "",
        "devicePluginDir": "/var/lib/kubelet/device-plugins",
    },
    "rdma-ipvlan": {
        "dataDir": "/var/lib/cni/rdma-ipvlan", "runDir": "/run/rdma-cni", "sysfsRoot": "/sys",
        "logFile": LOG_FILE,
        # Not paths, but node-wide all the same: an IPVLAN port has one mode for every pod on the
        # bond, and the kernel refuses a macvlan on a bond that has IPVLAN children (and the reverse),
        # so one pod's choice would change or break every other pod's.
        "link": "ipvlan", "ipvlanMode": "l2",
    },
    "rdma-multus": {
        "confDir": "/etc/cni/net.d/rdma-multus.d", "cacheDir": "/var/lib/cni/rdma-multus",
        "kubeconfig": "/etc/cni/net.d/rdma-multus.d/rdma-multus.kubeconfig", "binDir": None, "binDirs": None,
        "kubeletRootDir": "/var/lib/kubelet", "podResourcesDir": None,
        "devicePluginDir": "/var/lib/kubelet/device-plugins", "logFile": "/var/log/rdma-cni/rdma-multus.log",
    },
}
# Plugins that take a host interface away, or run another meta plugin with a NAD's paths: a NAD
# may not name them unless the node's admin lists them in ``networks.allowedTypes``.
DENIED_TYPES = ("host-device", "sriov", "ib-sriov", "dpdk", "rdma-multus", "multus", "multus-shim")

_PATH_FIX = "leave the key out of the network config: the node's admin sets it (chart values)"


@dataclass(frozen=True)
class Networks:
    """What rdma-multus may read from NetworkAttachmentDefinitions (Multus's own semantics)."""

    namespace_isolation: bool = True
    global_namespaces: tuple[str, ...] = ("default",)
    allowed_types: tuple[str, ...] | None = None  # None: every type but DENIED_TYPES
    denied_types: tuple[str, ...] = DENIED_TYPES

    def type_allowed(self, kind: str) -> bool:
        if self.allowed_types is not None:
            return kind in self.allowed_types
        return kind not in self.denied_types

    def namespace_allowed(self, pod_namespace: str, nad_namespace: str) -> bool:
        return (not self.namespace_isolation or nad_namespace == pod_namespace
                or nad_namespace in self.global_namespaces)


@dataclass(frozen=True)
class NodePolicy:
    """The node's file, read (see the module doc); :func:`load` builds it."""

    path: str = DEFAULT_PATH
    found: bool = False
    trust: str = TRUST_NODE
    bonds: tuple[str, ...] | None = None  # None: the netdevs that back an RDMA device
    bonds_from: str = BONDS_FROM_KUBELET
    rdma_required: bool = True  # False: a config may turn rdma.required off
    netns_mode: str = "shared"
    ipam_types: tuple[str, ...] = ()
    resources: tuple[str, ...] = (RDMA_RESOURCE,)  # the device-plugin resources that open bonds
    paths: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: DEFAULT_PATHS)
    networks: Networks = field(default_factory=Networks)

    @property
    def enforced(self) -> bool:
        return self.trust == TRUST_NODE

    def where(self) -> str:
        return f"the node policy {self.path}" + ("" if self.found else " (absent: its defaults)")

    def narrow(self, raw: Mapping[str, Any], plugin: str, cleanup: bool = False) -> dict[str, Any]:
        """``raw`` with every node path of ``plugin`` set to the node's. ADD/CHECK/STATUS
        (``cleanup`` False): a config key that names another path, or turns a node knob, is error 7
        naming it and this file. DEL/GC: the node's value wins, the config's is logged."""
        out = dict(raw)
        if not self.enforced:
            return out
        for key, node_value in self.paths.get(plugin, {}).items():
            given = raw.get(key)
            if given is None or given == node_value or (key == "logFile" and given == ""):
                if given is None and node_value is not None:
                    out[key] = node_value
                continue
            if cleanup:
                log.warning("%s: config key %r is %r, the node's is %r: using the node's", plugin, key, given,
                            node_value)
                out[key] = node_value
                continue
            shown = "not set" if node_value is None else repr(node_value)
            raise ConfigKeyError(key, f"config key {key!r} is {given!r}, but {self.where()} decides it "
                                      f"({shown}): {_PATH_FIX}")
        if not cleanup:
            self._check_knobs(out, plugin)
        elif isinstance(out.get("ipam"), dict) and out["ipam"].get("type") not in self.ipam_types:
            log.warning("%s: ignoring the config's ipam %r, which the node does not allow", plugin,
                        out["ipam"].get("type"))
            del out["ipam"]  # DEL never runs an IPAM plugin the node would not have run at ADD
        return out

    def _check_knobs(self, raw: Mapping[str, Any], plugin: str) -> None:
        rdma = raw.get("rdma")
        if isinstance(rdma, dict):
            if rdma.get("required") is False and self.rdma_required:
                raise self._knob("rdma.required", False, "only the node's admin may run pods without RDMA "
                                 "(rdmaRequired)")
            mode = rdma.get("netnsMode")
            if mode is not None and mode != self.netns_mode:
                raise self._knob("rdma.netnsMode", mode, f"the node runs RDMA netns mode {self.netns_mode!r}")
        ipam = raw.get("ipam")
        if ipam is not None and plugin != "rdma-multus":
            kind = ipam.get("type") if isinstance(ipam, dict) else None
            if kind not in self.ipam_types:
                allowed = ", ".join(self.ipam_types) or "none"
                raise self._knob("ipam", kind, f"IPAM plugins the node allows: {allowed} (ipamTypes)")

    def _knob(self, key: str, got: Any, why: str) -> ConfigKeyError:
        return ConfigKeyError(key, f"config key {key!r} is {got!r}, which {self.where()} does not allow: "
                                   f"{why}; leave it out, or ask the node's admin")

    def check_masters(self, masters: Sequence[str] | None, node_bonds: Sequence[str]) -> None:
        """``masters`` may only narrow the node's bonds (``node_bonds``: :attr:`bonds` or the
        netdevs behind the node's RDMA devices)."""
        if not self.enforced or not masters:
            return
        outside = [m for m in masters if m not in node_bonds]
        if outside:
            raise ConfigKeyError(
                "masters", f"config key 'masters' names {', '.join(outside)}, not a bond of this node "
                f"(its bonds: {', '.join(node_bonds) or 'none'}; {self.where()} decides them): name only "
                "those, or leave 'masters' out",
            )

    def check_resource(self, resource: str) -> None:
        """A config's ``resourceName`` says whose allocation opens a bond: only one the node lists."""
        if self.enforced and resource not in self.resources:
            raise ConfigKeyError(
                "resourceName", f"config key 'resourceName' is {resource!r}, not a resource {self.where()} "
                f"opens bonds for ({', '.join(self.resources)}): leave it out, or ask the node's admin to "
                "add it (resources)",
            )

    def node_bonds(self, default: Sequence[str]) -> list[str]:
        return list(self.bonds) if self.bonds is not None else list(default)


def load(env: Mapping[str, str]) -> NodePolicy:
    """The node's policy file (:data:`POLICY_ENV` of the call, else of this process: the agent's,
    else :data:`DEFAULT_PATH`); its defaults when there is
    none. A file that cannot be read or is wrong is error 7 naming it: a node whose admin wrote a
    policy must never run without it."""
    path = env.get(POLICY_ENV) or os.environ.get(POLICY_ENV) or DEFAULT_PATH
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20)
    except FileNotFoundError:
        return NodePolicy(path=path)
    except OSError as exc:
        raise CniError(INVALID_CONFIG, f"node policy {path} cannot be read ({exc.strerror}): the node's "
                       "admin must fix it") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CniError(INVALID_CONFIG, f"node policy {path} is not valid JSON ({exc}): the node's admin must "
                       "fix it (reinstall from the chart)") from None
    return parse(data, path)


def parse(data: Any, path: str = DEFAULT_PATH) -> NodePolicy:
    """The policy from the file's JSON; error 7 naming the key and the file."""
    if not isinstance(data, dict):
        raise _bad(path, "", "must be a JSON object")
    trust = _one_of(data, "trust", (TRUST_NODE, TRUST_CONFIGS), TRUST_NODE, path)
    bonds = data.get("bonds")
    if bonds is not None and not _names(bonds):
        raise _bad(path, "bonds", "must be null or a list of netdev names")
    paths = {plugin: dict(defaults) for plugin, defaults in DEFAULT_PATHS.items()}
    given = data.get("paths", {})
    if not isinstance(given, dict):
        raise _bad(path, "paths", "must be an object of plugin -> {key: path}")
    for plugin, keys in given.items():
        if plugin not in paths or not isinstance(keys, dict):
            raise _bad(path, f"paths.{plugin}", f"must be one of {', '.join(PLUGINS)}, an object")
        for key, value in keys.items():
            if key not in paths[plugin]:
                raise _bad(path, f"paths.{plugin}.{key}", f"is not a path key of {plugin}")
            if not _path_value(key, value):
                raise _bad(path, f"paths.{plugin}.{key}", "must be an absolute path (or \"\" / null)")
            paths[plugin][key] = value
    ipam = data.get("ipamTypes", [])
    if not _names(ipam, allow_empty=True):
        raise _bad(path, "ipamTypes", "must be a list of IPAM plugin names")
    resources = data.get("resources", [RDMA_RESOURCE])
    if not isinstance(resources, list) or not all(isinstance(r, str) and r for r in resources):
        raise _bad(path, "resources", "must be a list of resource names")
    return NodePolicy(
        path=path, found=True, trust=trust,
        bonds=tuple(bonds) if bonds is not None else None,
        bonds_from=_one_of(data, "bondsFrom", (BONDS_FROM_KUBELET, BONDS_FROM_CONFIG), BONDS_FROM_KUBELET,
                           path),
        rdma_required=_bool(data, "rdmaRequired", True, path),
        netns_mode=_one_of(data, "netnsMode", ("shared", "exclusive"), "shared", path),
        ipam_types=tuple(ipam), resources=tuple(resources), paths=paths,
        networks=_networks(data.get("networks", {}), path),
    )


def _networks(data: Any, path: str) -> Networks:
    if not isinstance(data, dict):
        raise _bad(path, "networks", "must be an object")
    glob = data.get("globalNamespaces", ["default"])
    if not _names(glob, allow_empty=True):
        raise _bad(path, "networks.globalNamespaces", "must be a list of namespace names")
    allowed = data.get("allowedTypes")
    if allowed is not None and not _names(allowed, allow_empty=True):
        raise _bad(path, "networks.allowedTypes", "must be null or a list of plugin type names")
    denied = data.get("deniedTypes", list(DENIED_TYPES))
    if not _names(denied, allow_empty=True):
        raise _bad(path, "networks.deniedTypes", "must be a list of plugin type names")
    return Networks(
        namespace_isolation=_bool(data, "namespaceIsolation", True, path, "networks."),
        global_namespaces=tuple(glob), allowed_types=tuple(allowed) if allowed is not None else None,
        denied_types=tuple(denied),
    )


CHOICES = {"link": ("ipvlan", "macvlan"), "ipvlanMode": ("l2", "l3", "l3s")}


def _path_value(key: str, value: Any) -> bool:
    if key in CHOICES:
        return value in CHOICES[key]
    if value is None or value == "":
        return key in ("logFile", "podResourcesDir", "binDir", "binDirs", "kubeconfig")
    if key == "binDirs":
        return isinstance(value, list) and all(isinstance(v, str) and v.startswith("/") for v in value)
    return isinstance(value, str) and value.startswith("/") and "\x00" not in value


def _names(value: Any, allow_empty: bool = False) -> bool:
    return (isinstance(value, list) and (allow_empty or bool(value))
            and all(isinstance(v, str) and v and "/" not in v for v in value))


def _one_of(data: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str, path: str) -> str:
    value = data.get(key, default)
    if value not in choices or not isinstance(value, str):
        raise _bad(path, key, f"must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value


def _bool(data: Mapping[str, Any], key: str, default: bool, path: str, prefix: str = "") -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise _bad(path, prefix + key, f"must be true or false, got {value!r}")
    return value


def _bad(path: str, key: str, problem: str) -> CniError:
    what = f"key {key!r} " if key else ""
    return CniError(INVALID_CONFIG, f"node policy {path}: {what}{problem}: the node's admin must fix it "
                    "(the chart's nodePolicy values)")
