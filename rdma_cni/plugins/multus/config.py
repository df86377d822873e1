"""rdma-multus's own network config, validated by hand (no pydantic: DEL and STATUS stay import-light).

Every error names the key and says how to fix it (CNI error 7); unknown keys are ignored, as CNI
configs customarily carry fields for other tools.

    {"cniVersion": "1.0.0", "name": "tke-multus", "type": "rdma-multus",
     "kubeconfig": "/etc/cni/net.d/rdma-multus.d/kubeconfig",
     "defaultDelegates": "tke-route-eni", "confDir": "/etc/cni/net.d/rdma-multus.d"}
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdma_cni.cni.errors import INVALID_CONFIG, CniError

DEFAULT_ANNOTATION = "tke.cloud.tencent.com/networks"
DEFAULT_RDMA_RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"


@dataclass(frozen=True)
class MultusConfig:
    """rdma-multus's network config, checked (see the module doc)."""

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


def _kubelet_root(raw: Mapping[str, Any]) -> str:
    return _str(raw, "kubeletRootDir", MultusConfig.kubelet_root_dir, absolute=True)


# Each field and how it is read from the raw config (one table, for ADD's strict reading and DEL's).
_FIELDS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "default_delegates": lambda raw: _delegates(raw),
    "kubeconfig": lambda raw: _str(raw, "kubeconfig", ""),
    "conf_dir": lambda raw: _str(raw, "confDir", MultusConfig.conf_dir, absolute=True),
    "annotation": lambda raw: _str(raw, "annotation", DEFAULT_ANNOTATION) or DEFAULT_ANNOTATION,
    "bin_dirs": lambda raw: _bin_dirs(raw),
    "cache_dir": lambda raw: _str(raw, "cacheDir", MultusConfig.cache_dir, absolute=True),
    "kubelet_root_dir": _kubelet_root,
    "device_plugin_dir": lambda raw: _str(
        raw, "devicePluginDir", os.path.join(_kubelet_root(raw), "device-plugins"), True
    ),
    "pod_resources_dir": lambda raw: _str(
        raw, "podResourcesDir", os.path.join(_kubelet_root(raw), "pod-resources"), True
    ),
    "pod_resources_timeout": lambda raw: _number(
        raw, "podResourcesTimeoutSeconds", MultusConfig.pod_resources_timeout
    ),
    "rdma_resource": lambda raw: (
        _str(raw, "rdmaResourceName", DEFAULT_RDMA_RESOURCE) or DEFAULT_RDMA_RESOURCE
    ),
    "api_timeout": lambda raw: _number(raw, "apiTimeoutSeconds", MultusConfig.api_timeout),
    "api_attempts": lambda raw: int(_number(raw, "apiAttempts", MultusConfig.api_attempts, integer=True)),
    "delegate_timeout": lambda raw: _number(raw, "delegateTimeoutSeconds", MultusConfig.delegate_timeout),
    "log_file": lambda raw: _str(raw, "logFile", MultusConfig.log_file),
    "log_level": lambda raw: _str(raw, "logLevel", MultusConfig.log_level),
}
# What DEL/GC cannot do without: where the plans and result caches are.
CLEANUP_ESSENTIAL = frozenset({"cache_dir"})


def parse_config(raw: Mapping[str, Any]) -> MultusConfig:
    return MultusConfig(**{name: read(raw) for name, read in _FIELDS.items()})


def parse_cleanup_config(raw: Mapping[str, Any]) -> tuple[MultusConfig, list[str]]:
    """The config for DEL/GC, which replay what ADD recorded whatever is wrong with the config now:
    a key that does not validate falls back to its default and its problem is returned for the
    log; only a bad ``cacheDir`` is still error 7."""
    values: dict[str, Any] = {"default_delegates": ()}
    problems = []
    for name, read in _FIELDS.items():
        try:
            values[name] = read(raw)
        except CniError as exc:
            if name in CLEANUP_ESSENTIAL:
                raise
            problems.append(exc.msg)
    return MultusConfig(**values), problems


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
