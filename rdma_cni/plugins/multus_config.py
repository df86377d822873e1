"""rdma-multus's own network config, validated by hand (no pydantic: DEL and STATUS stay import-light).

Every error names the key and says how to fix it (CNI error 7); unknown keys are ignored, as CNI
configs customarily carry fields for other tools.

    {"cniVersion": "1.0.0", "name": "tke-multus", "type": "rdma-multus",
     "kubeconfig": "/etc/cni/net.d/rdma-multus.d/kubeconfig",
     "defaultDelegates": "tke-route-eni", "confDir": "/etc/cni/net.d/rdma-multus.d"}
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdma_cni.cni.errors import INVALID_CONFIG, CniError

DEFAULT_ANNOTATION = "tke.cloud.tencent.com/networks"
DEFAULT_RDMA_RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"


@dataclass(frozen=True)
class MultusConfig:
    default_delegates: tuple[str, ...]
    kubeconfig: str = ""
    conf_dir: str = "/etc/cni/net.d"
    annotation: str = DEFAULT_ANNOTATION
    bin_dirs: tuple[str, ...] = ()  # empty: the runtime's CNI_PATH
    cache_dir: str = "/var/lib/cni/rdma-multus"
    kubelet_root_dir: str = "/var/lib/kubelet"
    # kubelet keeps device-plugins/ (and its checkpoint) at /var/lib/kubelet whatever its --root-dir,
    # while pod-resources/ follows --root-dir: each has its own key, both default under kubeletRootDir.
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    pod_resources_dir: str = "/var/lib/kubelet/pod-resources"
    pod_resources_timeout: float = 3.0
    rdma_resource: str = DEFAULT_RDMA_RESOURCE  # a pod holding these devices must get an RDMA network
    api_timeout: float = 10.0
    api_attempts: int = 3
    delegate_timeout: float = 60.0
    log_file: str = "/var/log/rdma-cni/rdma-multus.log"
    log_level: str = "info"

    def delegate_dirs(self, cni_path: Sequence[str]) -> tuple[str, ...]:
        return self.bin_dirs or tuple(cni_path)


def parse_config(raw: Mapping[str, Any]) -> MultusConfig:
    kubelet_root = _str(raw, "kubeletRootDir", MultusConfig.kubelet_root_dir, absolute=True)
    return MultusConfig(
        default_delegates=_delegates(raw),
        kubeconfig=_str(raw, "kubeconfig", ""),
        conf_dir=_str(raw, "confDir", MultusConfig.conf_dir, absolute=True),
        annotation=_str(raw, "annotation", DEFAULT_ANNOTATION) or DEFAULT_ANNOTATION,
        bin_dirs=_bin_dirs(raw),
        cache_dir=_str(raw, "cacheDir", MultusConfig.cache_dir, absolute=True),
        kubelet_root_dir=kubelet_root,
        device_plugin_dir=_str(raw, "devicePluginDir", os.path.join(kubelet_root, "device-plugins"), True),
        pod_resources_dir=_str(raw, "podResourcesDir", os.path.join(kubelet_root, "pod-resources"), True),
        pod_resources_timeout=_number(raw, "podResourcesTimeoutSeconds", MultusConfig.pod_resources_timeout),
        rdma_resource=_str(raw, "rdmaResourceName", DEFAULT_RDMA_RESOURCE) or DEFAULT_RDMA_RESOURCE,
        api_timeout=_number(raw, "apiTimeoutSeconds", MultusConfig.api_timeout),
        api_attempts=int(_number(raw, "apiAttempts", MultusConfig.api_attempts, integer=True)),
        delegate_timeout=_number(raw, "delegateTimeoutSeconds", MultusConfig.delegate_timeout),
        log_file=_str(raw, "logFile", MultusConfig.log_file),
        log_level=_str(raw, "logLevel", MultusConfig.log_level),
    )


def _fail(key: str, problem: str) -> CniError:
    return CniError(INVALID_CONFIG, f"rdma-multus config: '{key}' {problem}")


def _str(raw: Mapping[str, Any], key: str, default: str, absolute: bool = False) -> str:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _fail(key, f"must be a string, got {type(value).__name__}")
    if absolute and not value.startswith("/"):
        raise _fail(key, f"must be an absolute path, got {value!r}")
    return value


def _number(raw: Mapping[str, Any], key: str, default: float, integer: bool = False) -> float:
    value = raw.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
    ):
        kind = "a positive integer" if integer else "a positive number"
        raise _fail(key, f"must be {kind}, got {value!r}")
    if value <= 0:
        raise _fail(key, f"must be greater than 0, got {value!r}")
    return float(value)


def _delegates(raw: Mapping[str, Any]) -> tuple[str, ...]:
    value = raw.get("defaultDelegates")
    names: list[str]
    if isinstance(value, str):
        names = [n.strip() for n in value.split(",") if n.strip()]
    elif isinstance(value, list) and all(isinstance(n, str) for n in value):
        names = [n.strip() for n in value if n.strip()]
    elif value is None:
        names = []
    else:
        raise _fail("defaultDelegates", "must be a comma-separated string or a list of network names")
    if not names:
        raise _fail("defaultDelegates", 'is missing: name the cluster network, e.g. "tke-route-eni"')
    return tuple(names)


def _bin_dirs(raw: Mapping[str, Any]) -> tuple[str, ...]:
    dirs: list[str] = []
    if raw.get("binDir") is not None:
        dirs.append(_str(raw, "binDir", "", absolute=True))
    value = raw.get("binDirs")
    if value is not None:
        if not isinstance(value, list) or not all(isinstance(d, str) and d.startswith("/") for d in value):
            raise _fail("binDirs", "must be a list of absolute directory paths")
        dirs.extend(value)
    return tuple(dirs)
