"""The rdma-macvlan network config model; :func:`.config.parse_config` reads and validates it.

Each class is a frozen dataclass (attribute names are the config keys in snake_case) and the table
beside it says how each key is checked (:mod:`rdma_cni.cni.config_fields`, strict JSON types).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rdma_cni.cni import config_fields as cf
from rdma_cni.delegate_config import RDMA_RESOURCE, FilesConfig, files_fields

DEFAULT_DATA_DIR = "/var/lib/cni/rdma-macvlan"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
# kubelet's device manager keeps its checkpoint here whatever its --root-dir (kube/checkpoint.py)
DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


@dataclass(frozen=True)
class RdmaConfig:
    """The config's ``rdma`` object."""

    netns_mode: Literal["shared", "exclusive"] = "shared"
    required: bool = True
    gid_index: Literal["host"] | int = "host"
    gid_timeout_ms: int = 2000


RDMA_FIELDS = (
    cf.field("netns_mode", cf.one_of("shared", "exclusive"), "shared", key="netnsMode"),
    cf.field("required", cf.boolean, True),
    cf.field(
        "gid_index",
        cf.either(cf.one_of("host"), cf.integer(), "Input should be 'host' or a valid integer"),
        "host",
        key="gidIndex",
    ),
    cf.field("gid_timeout_ms", cf.integer(ge=0, le=600_000), 2000, key="gidTimeoutMs"),
)


@dataclass(frozen=True)
class MacvlanConfig(FilesConfig):
    """rdma-macvlan's network config, checked."""

    data_dir: str = DEFAULT_DATA_DIR
    name: str = ""
    masters: list[str] | None = None
    count: int = 1
    mode: Literal["bridge", "private", "vepa", "passthru"] = "bridge"
    mtu: int | None = None
    pod_if_name: Literal["master", "cni"] = "master"
    ipam: dict[str, Any] | None = None
    rdma: RdmaConfig = field(default_factory=RdmaConfig)
    # Where kubelet says which pod holds which device, read when no device ID says which bonds to
    # take (select.py): PodResources under the kubelet root (it follows --root-dir), else the
    # device checkpoint. ``pod_resources_dir`` "" means ``<kubeletRootDir>/pod-resources``.
    resource_name: str = RDMA_RESOURCE
    kubelet_root_dir: str = DEFAULT_KUBELET_ROOT
    pod_resources_dir: str = ""
    device_plugin_dir: str = DEFAULT_DEVICE_PLUGIN_DIR
    # How long ADD waits for a bond its device IDs name to be unpinned by the DEL of the container
    # that held it: kubelet hands a force-deleted pod's devices to the next pod before the old
    # sandbox's DEL has run (seen in the chaos run: the ADD answered 11 and the pod started 10-17 s
    # late, after kubelet's pod-worker back-off). 0 answers 11 at once, as before.
    pinned_wait_ms: int = 10_000

    def pod_resources(self) -> str:
        return self.pod_resources_dir or f"{self.kubelet_root_dir.rstrip('/')}/pod-resources"


FIELDS = (
    cf.field("name", cf.string(), ""),
    cf.field("masters", cf.optional(cf.list_of(cf.string())), None),
    cf.field("count", cf.integer(ge=1, le=64), 1),
    cf.field("mode", cf.one_of("bridge", "private", "vepa", "passthru"), "bridge"),
    cf.field("mtu", cf.optional(cf.integer(ge=68, le=65535)), None),
    cf.field("pod_if_name", cf.one_of("master", "cni"), "master", key="podIfName"),
    cf.field("ipam", cf.optional(cf.mapping), None),
    cf.Field("rdma", "rdma", cf.nested(RdmaConfig, RDMA_FIELDS), RdmaConfig),
    cf.field("resource_name", cf.string(min_length=1), RDMA_RESOURCE, key="resourceName"),
    cf.field("kubelet_root_dir", cf.string(min_length=1), DEFAULT_KUBELET_ROOT, key="kubeletRootDir"),
    cf.field("pod_resources_dir", cf.string(), "", key="podResourcesDir"),
    cf.field("device_plugin_dir", cf.string(min_length=1), DEFAULT_DEVICE_PLUGIN_DIR, key="devicePluginDir"),
    cf.field("pinned_wait_ms", cf.integer(ge=0, le=600_000), 10_000, key="pinnedWaitMs"),
    *files_fields(DEFAULT_DATA_DIR),
)


def read(raw: dict[str, Any]) -> MacvlanConfig:
    return cf.read(MacvlanConfig, FIELDS, raw)
