"""The rdma-macvlan network config (DESIGN.md "rdma-macvlan: behaviour"), read and validated by the
model in :mod:`rdma_cni.plugins.macvlan.model`.

Keys are camelCase like every CNI config; unknown keys are ignored (a conflist may carry keys for
other plugins); a wrong type or value is CNI error 7 naming the key and how to fix it, raised before
anything on the node is touched.
"""

from __future__ import annotations

from typing import Any

from rdma_cni import delegate_config
from rdma_cni.cni.config_fields import Invalid
from rdma_cni.cni.errors import ConfigKeyError as ConfigKeyError  # moved there: shared by the plugins
from rdma_cni.cni.errors import invalid_key, validate_dropping_bad_keys
from rdma_cni.cni.invoke import is_plain_name
from rdma_cni.plugins.macvlan import model as macvlan_model
from rdma_cni.plugins.macvlan.model import MacvlanConfig

# What to tell the user for each key, shown with the validation problem.
FIXES = {
    **delegate_config.FIXES,
    "count": 'a whole number of bonds per pod, 1-64, e.g. "count": 1',
    "mode": 'one of "bridge", "private", "vepa", "passthru"',
    "mtu": 'a whole number 68-65535 not above the bond\'s MTU, or leave it out',
    "podIfName": '"master" (pod interface named like the bond) or "cni" (CNI_IFNAME)',
    "rdma.required": "true or false (JSON booleans, not strings)",
    "rdma.gidIndex": '"host" or a GID table index such as 3',
    "rdma.gidTimeoutMs": "milliseconds as a whole number, e.g. 2000",
    "resourceName": 'the device plugin\'s resource, e.g. "tke.cloud.tencent.com/tke-shared-rdma"',
    "kubeletRootDir": "kubelet's --root-dir, an absolute path (default /var/lib/kubelet)",
    "podResourcesDir": "an absolute directory path holding kubelet.sock, or leave it out",
    "devicePluginDir": "an absolute directory path (kubelet's checkpoint: /var/lib/kubelet/device-plugins)",
    "pinnedWaitMs": "milliseconds as a whole number, 0-600000, e.g. 10000",
}


def parse_config(raw: dict[str, Any]) -> MacvlanConfig:
    """Validate the network config for ADD/CHECK; the first problem is error 7 naming key and fix."""
    cfg = _validate(raw)
    if cfg.ipam is not None and not is_plain_name(cfg.ipam["type"]):
        raise ConfigKeyError(
            "ipam.type",
            f"config key 'ipam.type' is {cfg.ipam['type']!r}: it must be a plain executable name looked up "
            'in CNI_PATH, e.g. "host-local"',
        )
    return cfg


# What DEL cannot do without: where the records are. Every other key has a default that is safe
# for giving the host back, since the record (not the config) says what ADD did.
DEL_ESSENTIAL = frozenset({"dataDir", "data_dir"})  # a key is read by its JSON name or its attribute name


def parse_del_config(raw: dict[str, Any]) -> tuple[MacvlanConfig, list[str]]:
    """The config for DEL/GC, which must undo what ADD did whatever is wrong with the config now
    (edited after ADD, or the config of an ADD that was refused): a key that does not validate is
    left at its default and its problem returned for the log. Only a bad ``dataDir`` is error 7.
    An IPAM ``type`` that can never run is kept here; the IPAM release logs and skips it."""
    return validate_dropping_bad_keys(raw, _validate, DEL_ESSENTIAL)


def _validate(raw: dict[str, Any]) -> MacvlanConfig:
    try:
        cfg = macvlan_model.read(raw)
    except Invalid as exc:
        raise _bad(exc.key, exc.problem, exc.got) from None
    delegate_config.check_ipam(cfg.ipam)
    delegate_config.check_masters(cfg.masters)
    for key, path in (("kubeletRootDir", cfg.kubelet_root_dir), ("podResourcesDir", cfg.pod_resources_dir),
                      ("devicePluginDir", cfg.device_plugin_dir)):  # fmt: skip
        if path and not path.startswith("/"):
            raise ConfigKeyError(key, f"config key {key!r} is {path!r}, not an absolute path: {FIXES[key]}")
    if isinstance(cfg.rdma.gid_index, int) and not 0 <= cfg.rdma.gid_index < 65536:
        fix = FIXES["rdma.gidIndex"]
        raise ConfigKeyError("rdma.gidIndex", f"config key 'rdma.gidIndex' is out of range: {fix}")
    return cfg


def _bad(key: str, problem: str, got: Any) -> ConfigKeyError:
    return invalid_key(key, problem, got, FIXES, "rdma-macvlan")
