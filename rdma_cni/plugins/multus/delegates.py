"""Running one delegate network (a ``.conf`` or ``.conflist`` from confDir) the way libcni runs it.

A :class:`Delegate` is everything needed to run a network for one pod interface — the config list,
the interface name, the CNI_ARGS and capability args, and what rdma-multus injects for device-plugin
resources — so that it can be written to disk before it runs and replayed by DEL long after the pod,
the API server and the netns are gone. Each network keeps its own libcni ``cniCacheV1`` result
(``<cacheDir>/results``), which CHECK and DEL feed back as ``prevResult``, exactly as a runtime would.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.cni import conflist
from rdma_cni.cni import version as cniver
from rdma_cni.cni.cache import CacheEntry, ResultCache
from rdma_cni.cni.errors import CHECK_FAILED, IO_FAILURE, CniError
from rdma_cni.cni.invoke import exec_plugin, find_plugin, is_plain_name
from rdma_cni.cni.netns_guard import overridden

log = logging.getLogger("rdma_cni.multus")


@dataclass
class Delegate:
    """One network to run for one pod interface; serialisable so DEL can replay it."""

    network: str
    ifname: str
    config: bytes  # the network's config list bytes (libcni's NetworkConfigList.Bytes)
    is_default: bool = False
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)
    # plugin index -> keys rdma-multus sets on that plugin: top-level ones and under runtimeConfig
    injected: dict[int, dict[str, Any]] = field(default_factory=dict)
    runtime_injected: dict[int, dict[str, Any]] = field(default_factory=dict)

    def net(self) -> conflist.NetworkConfigList:
        return conflist.parse_conflist(self.config, f"cached config of network {self.network}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "ifname": self.ifname,
            "config": self.config.decode(),
            "default": self.is_default,
            "cniArgs": [list(p) for p in self.cni_args],
            "capabilityArgs": self.capability_args,
            "injected": {str(k): v for k, v in self.injected.items()},
            "runtimeInjected": {str(k): v for k, v in self.runtime_injected.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Delegate:
        return cls(
            network=str(d["network"]),
            ifname=str(d["ifname"]),
            config=str(d["config"]).encode(),
            is_default=bool(d.get("default", False)),
            cni_args=[(str(k), str(v)) for k, v in d.get("cniArgs", [])],
            capability_args=dict(d.get("capabilityArgs") or {}),
            injected={int(k): dict(v) for k, v in (d.get("injected") or {}).items()},
            runtime_injected={int(k): dict(v) for k, v in (d.get("runtimeInjected") or {}).items()},
        )


@dataclass
class DelegateRunner:
    """Runs delegates for one container: binaries only from ``bin_dirs``, results in ``cache``."""

    bin_dirs: tuple[str, ...]
    cache: ResultCache
    container_id: str
    netns: str
    base_env: Mapping[str, str]
    timeout: float = 60.0

    def add(self, d: Delegate) -> dict[str, Any]:
        net = d.net()
        prev: dict[str, Any] | None = None
        for index, plugin in enumerate(net.plugins):
            # libcni: a plugin that prints nothing leaves the next one without a prevResult.
            prev = self._exec(d, net, index, plugin, "ADD", prev)
        result = prev or {"cniVersion": net.cni_version}
        self.cache.write(self._entry(d, result))
        return result

    def delete(self, d: Delegate) -> None:
        """DEL every plugin of the network, last first, each one even when another failed (DEL is
        best effort); the first failure is raised and the cached result kept for the retry. A plugin
        whose type can never run (a path, not a plain name) is logged and skipped: retrying it could
        never succeed and would keep the pod from ever going away."""
        net = d.net()
        cached = self.cache.read(d.network, self.container_id, d.ifname)
        prev = None
        if cached is not None and cached.result and cniver.at_least(net.cni_version, "0.4.0"):
            prev = conflist.convert_result(cached.result, net.cni_version)
        first: CniError | None = None
        for index in reversed(range(len(net.plugins))):
            plugin = net.plugins[index]
            if not is_plain_name(plugin.get("type")):
                log.error("delegate DEL %s (%s): plugin type %r can never run: skipped", d.network,
                          d.ifname, plugin.get("type"))
                continue
            try:
                self._exec(d, net, index, plugin, "DEL", prev)
            except (CniError, OSError) as exc:
                err = exc if isinstance(exc, CniError) else CniError(IO_FAILURE, f"{exc}")
                log.error("delegate DEL %s (%s) plugin %s failed: %s", d.network, d.ifname, plugin["type"],
                          err.msg)
                first = first or err
        if first is not None:
            raise first
        self.cache.delete(d.network, self.container_id, d.ifname)

    def check(self, d: Delegate) -> None:
        net = d.net()
        if net.disable_check or not cniver.at_least(net.cni_version, "0.4.0"):
            return
        cached = self.cache.read(d.network, self.container_id, d.ifname)
        if cached is None or not cached.result:
            raise CniError(
                CHECK_FAILED, f"network {d.network} ({d.ifname}) has no cached result: it was never added"
            )
        prev = conflist.convert_result(cached.result, net.cni_version)
        for index, plugin in enumerate(net.plugins):
            self._exec(d, net, index, plugin, "CHECK", prev)

    def _exec(
        self,
        d: Delegate,
        net: conflist.NetworkConfigList,
        index: int,
        plugin: Mapping[str, Any],
        command: str,
        prev: dict[str, Any] | None,
    ) -> dict[str, Any] | None:
        stdin = conflist.plugin_stdin(net, {**plugin, **d.injected.get(index, {})}, prev, d.capability_args)
        extra = d.runtime_injected.get(index)
        if extra:
            stdin["runtimeConfig"] = {**stdin.get("runtimeConfig", {}), **extra}
        path = find_plugin(str(plugin["type"]), self.bin_dirs)
        env = self._env(d)
        log.info("delegate %s %s (%s) ifname=%s", command, d.network, plugin["type"], d.ifname)
        return exec_plugin(path, command, env, stdin, self.timeout)

    def _env(self, d: Delegate) -> dict[str, str]:
        env = {k: v for k, v in self.base_env.items() if not k.startswith("CNI_")}
        if overridden(self.base_env):  # the runtime allowed its own netns: so do the delegates
            env["CNI_NETNS_OVERRIDE"] = self.base_env["CNI_NETNS_OVERRIDE"]
        env.update(
            CNI_CONTAINERID=self.container_id,
            CNI_NETNS=self.netns,
            CNI_IFNAME=d.ifname,
            CNI_ARGS=";".join(f"{k}={v}" for k, v in d.cni_args),
            CNI_PATH=":".join(self.bin_dirs),
        )
        return env

    def _entry(self, d: Delegate, result: dict[str, Any] | None) -> CacheEntry:
        return CacheEntry(
            network=d.network,
            container_id=self.container_id,
            ifname=d.ifname,
            config=d.config,
            netns=self.netns,
            cni_args=list(d.cni_args),
            capability_args=dict(d.capability_args),
            result=result,
        )


def gc_network(
    net: conflist.NetworkConfigList,
    valid: Sequence[tuple[str, str]],
    bin_dirs: tuple[str, ...],
    base_env: Mapping[str, str],
    timeout: float,
) -> None:
    """Forward GC to every plugin of ``net`` (spec 1.1 only), telling it which attachments live."""
    if net.disable_gc or not cniver.at_least(net.cni_version, "1.1.0"):
        return
    env = {k: v for k, v in base_env.items() if not k.startswith("CNI_")}
    env["CNI_PATH"] = ":".join(bin_dirs)
    for plugin in net.plugins:
        path = find_plugin(str(plugin["type"]), bin_dirs)
        exec_plugin(path, "GC", env, conflist.gc_stdin(net, plugin, valid), timeout)


def status_network(
    net: conflist.NetworkConfigList, bin_dirs: tuple[str, ...], base_env: Mapping[str, str], timeout: float
) -> None:
    """Forward STATUS to every plugin of ``net`` (spec 1.1 only); the first failure is the answer."""
    if not cniver.at_least(net.cni_version, "1.1.0"):
        return
    env = {k: v for k, v in base_env.items() if not k.startswith("CNI_")}
    env["CNI_PATH"] = ":".join(bin_dirs)
    for plugin in net.plugins:
        path = find_plugin(str(plugin["type"]), bin_dirs)
        exec_plugin(path, "STATUS", env, conflist.status_stdin(net, plugin), timeout)
