"""One fuzz target per parser of tenant-written input: each takes the fuzzer's bytes, feeds the parser
what a tenant could hand it, and lets through only the parser's typed errors (a CNI error with a
code, a claim-shape error that the DRA service turns into a gRPC status). Anything else escaping is
a crash: a bug, and a unit test before its fix.

    TARGETS["macvlan-config"](b'{"masters": ["bond0"]}')   # returns; raises only on a crash

Every tenant input is JSON. Bytes that parse as JSON are taken as they are (the seeds, and what the
fuzzer mutates from them); any other bytes drive :func:`structured`, which builds a JSON value whose
keys and strings come mostly from the parsers' own vocabulary, so the fuzzer reaches past the first
``isinstance`` check instead of spending its time on bytes that are not JSON at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import atheris

from rdma_cni import node_policy
from rdma_cni.cni import conflist
from rdma_cni.cni import result as cni_result
from rdma_cni.cni.errors import CniError
from rdma_cni.cni.request import parse_request
from rdma_cni.dra import claims
from rdma_cni.plugins.ipvlan import config as ipvlan_config
from rdma_cni.plugins.macvlan import config as macvlan_config
from rdma_cni.plugins.macvlan.select import requested_device_ids
from rdma_cni.plugins.multus import config as multus_config
from rdma_cni.plugins.multus import nad, networks

EXPECTED: tuple[type[BaseException], ...] = (CniError, claims.ClaimShapeError)
POLICY = node_policy.NodePolicy()  # the defaults: what a node without a policy file enforces
ENV = {
    "CNI_CONTAINERID": "c1",
    "CNI_IFNAME": "net1",
    "CNI_NETNS": "/run/netns/p",
    "CNI_PATH": "/opt/cni/bin",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=p",
}


KEYS = (
    "cniVersion",
    "name",
    "type",
    "masters",
    "count",
    "mode",
    "mtu",
    "podIfName",
    "ipam",
    "rdma",
    "required",
    "netnsMode",
    "gidIndex",
    "gidTimeoutMs",
    "resourceName",
    "kubeletRootDir",
    "podResourcesDir",
    "devicePluginDir",
    "pinnedWaitMs",
    "dataDir",
    "runDir",
    "sysfsRoot",
    "logFile",
    "logLevel",
    "link",
    "ipvlanMode",
    "ranges",
    "exclude",
    "bond0",
    "kubeconfig",
    "confDir",
    "defaultDelegates",
    "annotation",
    "binDir",
    "binDirs",
    "cacheDir",
    "apiTimeoutSeconds",
    "apiAttempts",
    "deviceID",
    "runtimeConfig",
    "deviceIDs",
    "mac",
    "ips",
    "prevResult",
    "interfaces",
    "routes",
    "dns",
    "address",
    "gateway",
    "interface",
    "dst",
    "gw",
    "table",
    "scope",
    "priority",
    "nameservers",
    "sandbox",
    "plugins",
    "spec",
    "config",
    "metadata",
    "annotations",
    "k8s.v1.cni.cncf.io/resourceName",
    "uid",
    "status",
    "allocation",
    "devices",
    "results",
    "request",
    "driver",
    "pool",
    "device",
    "shareID",
    "opaque",
    "parameters",
    "source",
    "requests",
    "apiVersion",
    "kind",
    "trust",
    "bonds",
    "bondsFrom",
    "rdmaRequired",
    "ipamTypes",
    "resources",
    "paths",
    "rdma-macvlan",
    "rdma-ipvlan",
    "rdma-multus",
    "networks",
    "namespaceIsolation",
    "globalNamespaces",
    "allowedTypes",
    "deniedTypes",
    "namespace",
    "cni-args",
    "capabilities",
    "args",
)
WORDS = (
    "",
    "1.0.0",
    "0.3.1",
    "0.4.0",
    "1.1.0",
    "rdma-macvlan",
    "rdma-ipvlan",
    "rdma-multus",
    "host-device",
    "host-local",
    "bond0",
    "bond1",
    "eth0",
    "mlx5_bond_0",
    "0000:3b:00.0",
    "7",
    "shared",
    "exclusive",
    "host",
    "master",
    "cni",
    "bridge",
    "passthru",
    "ipvlan",
    "macvlan",
    "l3",
    "/sys",
    "/tmp/x",
    "/var/lib/cni/rdma-macvlan",
    "/run/rdma-cni",
    "relative",
    "198.51.100.2/28",
    "198.51.100.4-198.51.100.14",
    "198.51.100.9",
    "2001:db8::1/64",
    "0.0.0.0/0",
    "02:00:00:00:00:01",
    "FromClass",
    "FromClaim",
    "rdma.tke.cloud.tencent.com",
    "rdma.tke.cloud.tencent.com/v1alpha1",
    "RdmaConfig",
    "node-a",
    "node",
    "configs",
    "kubelet",
    "default",
    "tke.cloud.tencent.com/tke-shared-rdma",
    "a/b@c",
    "debug",
)


def structured(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """A JSON value drawn from the fuzzer's bytes: objects keyed by the parsers' vocabulary."""
    kind = fdp.ConsumeIntInRange(0, 9 if depth < 5 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return (
            fdp.ConsumeIntInRange(-(2**33), 2**33) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(-2, 70000)
        )
    if kind == 3:
        return fdp.ConsumeRegularFloat()
    if kind in (4, 5):
        return (
            WORDS[fdp.ConsumeIntInRange(0, len(WORDS) - 1)] if fdp.ConsumeBool() else fdp.ConsumeUnicode(24)
        )
    if kind in (6, 7):
        return [structured(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    out: dict[str, Any] = {}
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        key = (
            KEYS[fdp.ConsumeIntInRange(0, len(KEYS) - 1)]
            if fdp.ConsumeIntInRange(0, 7)
            else fdp.ConsumeUnicode(8)
        )
        out[key] = structured(fdp, depth + 1)
    return out


def _json(data: bytes) -> Any:
    """The input as JSON (see the module doc)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        fdp = atheris.FuzzedDataProvider(data)
        return structured(fdp)


def _text(data: bytes) -> str:
    """A string input (an annotation): a JSON string as the text, else a structured value rendered."""
    value = _json(data)
    return value if isinstance(value, str) else json.dumps(value)


def _expected(fn: Callable[[bytes], None]) -> Callable[[bytes], None]:
    def target(data: bytes) -> None:
        try:
            fn(data)
        except EXPECTED:
            pass

    target.__name__ = fn.__name__
    target.__doc__ = fn.__doc__
    return target


@_expected
def plugin_request(data: bytes) -> None:
    """The CNI core's reading of stdin (a NAD's config as Multus hands it) and CNI_ARGS."""
    value = _json(data)
    req = parse_request(
        ENV, data if isinstance(value, str) else json.dumps(value).encode(), "ADD", frozenset({"MAC"})
    )
    requested_device_ids(req)
    if req.prev_result is not None:
        cni_result.render(req.prev_result, req.cni_version)


def _config_target(
    plugin: str, add: Callable[[Any], object], cleanup: Callable[[Any], object], doc: str
) -> Callable[[bytes], None]:
    """A plugin's config through the node policy, read as ADD reads it and as DEL does."""

    def target(data: bytes) -> None:
        raw = _json(data)
        if isinstance(raw, dict):
            add(POLICY.narrow(raw, plugin))
            cleanup(POLICY.narrow(raw, plugin, cleanup=True))

    target.__doc__ = doc
    return _expected(target)


macvlan_config_target = _config_target(
    "rdma-macvlan",
    macvlan_config.parse_config,
    macvlan_config.parse_del_config,
    "A NAD's rdma-macvlan config through the node policy, for ADD and for DEL.",
)
ipvlan_config_target = _config_target(
    "rdma-ipvlan",
    ipvlan_config.parse_config,
    ipvlan_config.parse_del_config,
    "A NAD's rdma-ipvlan config through the node policy, for ADD and for DEL.",
)
multus_config_target = _config_target(
    "rdma-multus",
    multus_config.parse_config,
    multus_config.parse_cleanup_config,
    "rdma-multus's own config (a NAD may name it under upstream Multus).",
)


@_expected
def annotation(data: bytes) -> None:
    """Both networks annotations: the comma list and the JSON form."""
    text = data.decode("utf-8", "replace")
    if not text.lstrip().startswith(("[", "{")) and text.isprintable():
        networks.parse_annotation(text, "k8s.v1.cni.cncf.io/networks")  # the comma list, as written
    networks.parse_annotation(_text(data), "k8s.v1.cni.cncf.io/networks")


@_expected
def nad_definition(data: bytes) -> None:
    """A NetworkAttachmentDefinition object as the API returns it: spec.config and its annotations."""
    obj = _json(data)
    if not isinstance(obj, dict):
        obj = {"spec": {"config": obj if isinstance(obj, str) else json.dumps(obj)}}
    elif isinstance(obj.get("spec"), dict) and not isinstance(obj["spec"].get("config"), str):
        obj["spec"]["config"] = json.dumps(obj["spec"].get("config"))  # a config object, as its text
    config = nad._spec_config(obj, "NetworkAttachmentDefinition team-a/n")
    resource = nad._annotations(obj).get(nad.RESOURCE_ANNOTATION)
    text = nad._completed(config, "n", resource if isinstance(resource, str) else "", "NAD team-a/n")
    net = conflist.parse_conflist(text, "NAD") if "plugins" in config else conflist.parse_single(text, "NAD")
    nad._check_types(POLICY.networks, net, "NAD team-a/n")


@_expected
def prev_result(data: bytes) -> None:
    """A prevResult (a chained plugin's answer, which a NAD's conflist can shape)."""
    parsed = cni_result.parse(_json(data), "prevResult")
    for version in ("0.3.1", "0.4.0", "1.0.0", "1.1.0"):
        cni_result.render(parsed, version)


@_expected
def dra_claim(data: bytes) -> None:
    """A ResourceClaim as our DRA driver reads it: its allocation and its opaque config."""
    obj = _json(data)
    if isinstance(obj, dict):
        claims.allocated(obj, "rdma.tke.cloud.tencent.com", "node-a")
        claims.driver_config(obj, "rdma.tke.cloud.tencent.com")
        claims.uid_of(obj)


@_expected
def policy_file(data: bytes) -> None:
    """The node policy file (the admin's, but a broken one must be an error, never a crash)."""
    node_policy.parse(_json(data), "/etc/rdma-cni/node-policy.json")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "request": plugin_request,
    "macvlan-config": macvlan_config_target,
    "ipvlan-config": ipvlan_config_target,
    "multus-config": multus_config_target,
    "annotation": annotation,
    "nad": nad_definition,
    "prev-result": prev_result,
    "dra-claim": dra_claim,
    "node-policy": policy_file,
}
