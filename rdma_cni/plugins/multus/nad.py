"""Where a network's CNI config comes from: ``confDir`` first, then its NetworkAttachmentDefinition.

A network the pod names that has no config file in ``confDir`` is looked up as Multus does: the
``k8s.cni.cncf.io/v1`` NetworkAttachmentDefinition of that name in the namespace the annotation
gives (else the pod's), whose ``spec.config`` is the delegate's config (a list or a single plugin;
a config without ``name`` takes the object's name). The object's
``k8s.v1.cni.cncf.io/resourceName`` annotation names its device-plugin resource, as with Multus.
Only ADD reads the API: the plan stores the config bytes, so DEL, CHECK and GC never need it.

A NAD is written by a namespace user, not the node's admin, so the node's policy
(:class:`rdma_cni.node_policy.Networks`) bounds it as Multus's ``namespaceIsolation`` does: a pod
reads NADs of its own namespace and of ``globalNamespaces`` only, and a NAD may name only the
delegate types the node allows (never, by default, one that takes a host interface away). A config
file in ``confDir`` is the node's and is not bounded.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from rdma_cni.cni import conflist
from rdma_cni.cni.errors import INVALID_CONFIG, CniError
from rdma_cni.node_policy import Networks
from rdma_cni.plugins.multus.config import MultusConfig
from rdma_cni.plugins.multus.networks import NetworkSelection
from rdma_cni.plugins.multus.pod import PodView

log = logging.getLogger("rdma_cni.multus")

RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"


def load_network(
    cfg: MultusConfig, sel: NetworkSelection, pod: PodView, bounds: Networks | None = None
) -> conflist.NetworkConfigList:
    """The network ``sel`` names: the node's file in ``confDir``, else its NAD within ``bounds``."""
    try:
        return conflist.load(cfg.conf_dir, sel.name)
    except conflist.NetworkNotFound as missing:
        namespace = sel.namespace or pod.namespace
        if not cfg.kubeconfig:
            raise CniError(
                INVALID_CONFIG,
                f"network {sel.name}: {missing.msg}, and without a kubeconfig rdma-multus cannot read "
                f"NetworkAttachmentDefinition {namespace or '<pod namespace>'}/{sel.name}: add the config "
                "to confDir or set 'kubeconfig'",
            ) from missing
        if not namespace:
            raise CniError(
                INVALID_CONFIG,
                f"network {sel.name}: {missing.msg}, and the pod's namespace is unknown (no "
                "K8S_POD_NAMESPACE in CNI_ARGS): name it as namespace/name in the annotation",
            ) from missing
        if bounds is not None:
            _check_namespace(bounds, pod, namespace, sel.name)
        net = _from_definition(cfg, pod, namespace, sel.name)
        if bounds is not None:
            _check_types(bounds, net, f"NetworkAttachmentDefinition {namespace}/{sel.name}")
        return net


def _check_namespace(bounds: Networks, pod: PodView, namespace: str, name: str) -> None:
    if bounds.namespace_allowed(pod.namespace, namespace):
        return
    allowed = ", ".join([pod.namespace, *bounds.global_namespaces])
    raise CniError(
        INVALID_CONFIG,
        f"network {namespace}/{name}: pod {pod.namespace}/{pod.name} may not use a "
        f"NetworkAttachmentDefinition of namespace {namespace} (namespaceIsolation: only "
        f"{allowed}; the node's admin decides it in the node policy's networks.globalNamespaces): create "
        "the NAD in the pod's namespace",
    )


def _check_types(bounds: Networks, net: conflist.NetworkConfigList, what: str) -> None:
    for plugin in net.plugins:
        kind = str(plugin.get("type", ""))
        if not bounds.type_allowed(kind):
            raise CniError(
                INVALID_CONFIG,
                f"{what}: plugin type {kind!r} may not be named by a NetworkAttachmentDefinition on this "
                "node (it can take a host interface, or run with paths the node did not choose; the node's "
                "admin decides it in the node policy's networks.allowedTypes/deniedTypes): use rdma-macvlan "
                "or rdma-ipvlan, or ask the node's admin",
            )


def _from_definition(
    cfg: MultusConfig, pod: PodView, namespace: str, name: str
) -> conflist.NetworkConfigList:
    obj = pod.api().get_network_attachment_definition(namespace, name)
    what = f"NetworkAttachmentDefinition {namespace}/{name}"
    if obj is None:
        raise CniError(
            INVALID_CONFIG,
            f"network {name}: no config in {cfg.conf_dir} and no {what} in the Kubernetes API: create one "
            "or fix the name in the pod's annotation",
        )
    config = _spec_config(obj, what)
    resource = _annotations(obj).get(RESOURCE_ANNOTATION)
    data = _completed(config, name, resource if isinstance(resource, str) else "", what)
    source = f"{what} spec.config"
    net = (
        conflist.parse_conflist(data, source) if "plugins" in config else conflist.parse_single(data, source)
    )
    log.info("network %s: config from %s", name, what)
    return net


def _spec_config(obj: dict[str, Any], what: str) -> dict[str, Any]:
    spec = obj.get("spec")
    text = spec.get("config") if isinstance(spec, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise CniError(INVALID_CONFIG, f"{what}: spec.config is empty or missing: put the CNI config in it")
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise CniError(
            INVALID_CONFIG, f"{what}: spec.config is not valid JSON ({exc}): fix the object"
        ) from exc
    if not isinstance(config, dict):
        raise CniError(INVALID_CONFIG, f"{what}: spec.config must be a JSON object (a CNI config)")
    return config


def _annotations(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def _completed(config: dict[str, Any], name: str, resource: str, what: str) -> bytes:
    """The config bytes with the object's name and resource filled in where the config has none."""
    if "name" not in config:
        config = {**config, "name": name}
    if resource and "resourceName" not in config:
        config = {**config, "resourceName": resource}
    if not isinstance(config.get("name"), str) or not config["name"]:
        raise CniError(INVALID_CONFIG, f"{what}: spec.config field 'name' must be a non-empty string")
    return json.dumps(config).encode()
