"""Running a network config list the way a libcni runtime does: ADD, CHECK, DEL, GC, STATUS.

This is the runtime half of the protocol (what containerd or cnitool do with a ``.conflist``), kept
in one place so ``cni-tool`` behaves like upstream cnitool and can be checked against it:

* ADD runs the plugins in order, each getting the previous plugin's result as ``prevResult``; the
  last result is cached (libcni format, see :mod:`rdma_cni.cni.cache`) and returned. A failure
  stops the chain and is reported with the plugin's type (libcni does not roll back either: the
  caller runs DEL).
* CHECK (>= 0.4.0, unless ``disableCheck``) and DEL (reverse order) get the cached result,
  converted to the list's version, as ``prevResult``. DEL removes the cache entry afterwards; an
  unreadable entry is dropped and DEL goes on without ``prevResult`` (newer libcni does the same,
  so a corrupt cache can never block a teardown).
* GC DELs every cached attachment of the network that is not valid, then (>= 1.1.0) sends GC with
  ``cni.dev/valid-attachments`` to every plugin. STATUS (>= 1.1.0) asks every plugin in order.

Plugins inherit the caller's environment plus the ``CNI_*`` variables, exactly as libcni builds it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.cni import conflist
from rdma_cni.cni import version as cniver
from rdma_cni.cni.cache import CacheEntry, ResultCache
from rdma_cni.cni.conflist import NetworkConfigList
from rdma_cni.cni.errors import DELEGATE_FAILURE, INCOMPATIBLE_VERSION, CniError
from rdma_cni.cni.invoke import exec_plugin, find_plugin
from rdma_cni.cni.request import validate_container_id, validate_ifname, validate_network_name

log = logging.getLogger(__name__)

# exec_plugin's signature, injectable so a meta plugin or a test can wrap it.
Executor = Callable[[str, str, Mapping[str, str], Mapping[str, Any]], "dict[str, Any] | None"]


class ChainError(CniError):
    """A chain step failed; ``ran`` plugins had been executed (the failing one included, if it ran)."""

    def __init__(self, err: CniError, ran: int) -> None:
        super().__init__(err.code, err.msg, err.details)
        self.ran = ran


@dataclass
class RuntimeConf:
    """One attachment's runtime arguments (libcni's RuntimeConf)."""

    container_id: str
    netns: str
    ifname: str
    args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class GcReport:
    """What GC did: the stale attachments it deleted and the ones whose DEL failed."""

    deleted: list[CacheEntry] = field(default_factory=list)
    failed: list[tuple[CacheEntry, CniError]] = field(default_factory=list)


class Runtime:
    """Runs network lists against plugins found in ``plugin_dirs``, caching in ``cache``."""

    def __init__(
        self,
        plugin_dirs: Sequence[str],
        cache: ResultCache,
        base_env: Mapping[str, str] | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.plugin_dirs = tuple(plugin_dirs)
        self.cache = cache
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._exec: Executor = executor or _default_executor

    # ---- verbs -------------------------------------------------------------------------------

    @staticmethod
    def validate(net: NetworkConfigList, rt: RuntimeConf) -> None:
        """What libcni checks before an ADD runs anything: container ID, network name, ifname."""
        validate_container_id(rt.container_id)
        validate_network_name(net.name)
        validate_ifname(rt.ifname)

    def add(self, net: NetworkConfigList, rt: RuntimeConf) -> dict[str, Any]:
        """ADD every plugin in order; cache and return the last result."""
        self.validate(net, rt)
        result: dict[str, Any] | None = None
        for index, plugin in enumerate(net.plugins):
            stdin = conflist.plugin_stdin(net, plugin, result, rt.capability_args)
            try:
                path = find_plugin(str(plugin.get("type", "")), self.plugin_dirs)
            except CniError as err:
                raise ChainError(err, ran=index) from err
            try:
                out = self._run(plugin, "ADD", rt, stdin, path)
            except CniError as err:
                raise ChainError(err, ran=index + 1) from err
            if out is None:
                silent = CniError(DELEGATE_FAILURE, f"{_describe(plugin)} failed (add): it printed no result")
                raise ChainError(silent, ran=index + 1)
            result = out
        assert result is not None  # a list has at least one plugin
        self.cache.write(
            CacheEntry(
                network=net.name,
                container_id=rt.container_id,
                ifname=rt.ifname,
                config=net.raw,
                netns=rt.netns,
                cni_args=list(rt.args),
                capability_args=dict(rt.capability_args),
                result=result,
            )
        )
        return result

    def check(self, net: NetworkConfigList, rt: RuntimeConf) -> bool:
        """CHECK every plugin in order with the cached result; False when disableCheck skipped it."""
        _require(net, "0.4.0", "CHECK")
        if net.disable_check:
            return False
        prev = self.cached_result(net, rt)
        for plugin in net.plugins:
            self._run(plugin, "CHECK", rt, conflist.plugin_stdin(net, plugin, prev, rt.capability_args))
        return True

    def delete(self, net: NetworkConfigList, rt: RuntimeConf) -> None:
        """DEL every plugin in reverse order, then drop the cache entry."""
        prev: dict[str, Any] | None = None
        if _at_least(net, "0.4.0"):
            try:
                prev = self.cached_result(net, rt)
            except CniError as err:
                log.warning("ignoring unusable cached result of %s: %s", net.name, err.msg)
                self._forget(net.name, rt)
        for plugin in reversed(net.plugins):
            self._run(plugin, "DEL", rt, conflist.plugin_stdin(net, plugin, prev, rt.capability_args))
        self._forget(net.name, rt)

    def gc(
        self, net: NetworkConfigList, is_valid: Callable[[CacheEntry], bool], send_valid_list: bool = True
    ) -> GcReport:
        """DEL each cached attachment of ``net`` that ``is_valid`` rejects, then GC the plugins."""
        report = GcReport()
        if net.disable_gc:
            return report
        valid: list[tuple[str, str]] = []
        for entry in self.cache.entries(network=net.name):
            if is_valid(entry):
                valid.append((entry.container_id, entry.ifname))
                continue
            rt = RuntimeConf(
                entry.container_id, entry.netns, entry.ifname, entry.cni_args, entry.capability_args
            )
            try:
                self.delete(net, rt)
                report.deleted.append(entry)
            except CniError as err:
                report.failed.append((entry, err))
        if _at_least(net, "1.1.0"):
            empty = RuntimeConf("", "", "")
            for plugin in net.plugins:
                stdin = conflist.gc_stdin(net, plugin, valid if send_valid_list else None)
                self._run(plugin, "GC", empty, stdin)
        return report

    def status(self, net: NetworkConfigList) -> bool:
        """STATUS every plugin in order; False when the list's version has no STATUS (< 1.1.0)."""
        if not _at_least(net, "1.1.0"):
            return False
        for plugin in net.plugins:
            self._run(plugin, "STATUS", RuntimeConf("", "", ""), conflist.status_stdin(net, plugin))
        return True

    # ---- cache -------------------------------------------------------------------------------

    def cached_result(self, net: NetworkConfigList, rt: RuntimeConf) -> dict[str, Any] | None:
        """The cached ADD result in the list's version (what CHECK and DEL pass as prevResult)."""
        entry = self.cache.read(net.name, rt.container_id, rt.ifname)
        if entry is None or entry.result is None:
            return None
        if not cniver.is_supported(net.cni_version):
            return entry.result
        return conflist.convert_result(entry.result, net.cni_version)

    def _forget(self, network: str, rt: RuntimeConf) -> None:
        try:
            self.cache.delete(network, rt.container_id, rt.ifname)
        except CniError as err:  # an invalid name has no file to delete
            log.debug("no cache entry to delete: %s", err.msg)

    # ---- execution ---------------------------------------------------------------------------

    def _run(
        self,
        plugin: Mapping[str, Any],
        command: str,
        rt: RuntimeConf,
        stdin: Mapping[str, Any],
        path: str = "",
    ) -> dict[str, Any] | None:
        path = path or find_plugin(str(plugin.get("type", "")), self.plugin_dirs)
        env = dict(self.base_env)
        env.update(
            CNI_COMMAND=command,
            CNI_CONTAINERID=rt.container_id,
            CNI_NETNS=rt.netns,
            CNI_ARGS=";".join(f"{k}={v}" for k, v in rt.args),
            CNI_IFNAME=rt.ifname,
            CNI_PATH=":".join(self.plugin_dirs),
        )
        try:
            return self._exec(path, command, env, stdin)
        except CniError as err:
            verb = {"ADD": "add", "DEL": "delete", "CHECK": "check", "GC": "gc", "STATUS": "status"}[command]
            raise CniError(err.code, f"{_describe(plugin)} failed ({verb}): {err.msg}", err.details) from err


def _default_executor(
    path: str, command: str, env: Mapping[str, str], stdin: Mapping[str, Any]
) -> dict[str, Any] | None:
    return exec_plugin(path, command, env, stdin)


def _describe(plugin: Mapping[str, Any]) -> str:
    return f"plugin type={str(plugin.get('type', ''))!r}"


def _at_least(net: NetworkConfigList, minimum: str) -> bool:
    try:
        return cniver.at_least(net.cni_version, minimum)
    except ValueError as exc:
        raise CniError(
            INCOMPATIBLE_VERSION, f"network {net.name!r}: cniVersion {net.cni_version!r} is not a version"
        ) from exc


def _require(net: NetworkConfigList, minimum: str, verb: str) -> None:
    if not _at_least(net, minimum):
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"network {net.name!r} has cniVersion {net.cni_version}, which does not support {verb} "
            f"(needs {minimum} or newer)",
        )
