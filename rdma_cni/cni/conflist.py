"""Network configs the way libcni finds and feeds them: load by name, then one stdin per plugin.

Loading (libcni ``LoadNetworkConf``): in the config dir, ``*.conflist`` files are read in name order
and the first whose ``name`` matches wins; otherwise ``*.conf``/``*.json`` files (a single plugin
each) are tried the same way and the match becomes a one-plugin list. As in libcni, a file that cannot
be parsed stops the search (the error names the file), because silently skipping it would pick a
different network than the runtime picks. A list may carry ``cniVersions`` (spec 1.1): the highest
version we speak is chosen. A list without inline ``plugins`` takes them from ``<dir>/<name>/*.conf``
unless ``loadOnlyInlinedPlugins`` is true.

Feeding (libcni ``buildOneConfig``): each plugin gets its own object with the list's ``name`` and
``cniVersion`` forced in, ``prevResult`` when there is one, and ``runtimeConfig`` holding only the
capability args the plugin declares under ``capabilities`` (an existing ``runtimeConfig`` key is
replaced, as libcni does). A meta plugin (rdma-multus) and ``cni-tool`` share this so that a
delegate sees exactly what it would see from a real runtime.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdma_cni.cni import gojson
from rdma_cni.cni import version as cniver
from rdma_cni.cni.errors import INVALID_CONFIG, IO_FAILURE, CniError
from rdma_cni.cni.result import parse as parse_result
from rdma_cni.cni.result import render

LIST_EXTENSIONS = (".conflist",)
SINGLE_EXTENSIONS = (".conf", ".json")


class NetworkNotFound(CniError):
    """No config in the directory has the requested network name."""

    def __init__(self, directory: str, name: str, available: Sequence[str]) -> None:
        if available:
            msg = f"no network named {name!r} in {directory}: found {', '.join(sorted(available))}"
        else:
            msg = f"no network configs (*.conflist, *.conf, *.json) in {directory}: set NETCONFPATH"
        super().__init__(INVALID_CONFIG, msg)
        self.directory = directory
        self.name = name


@dataclass(frozen=True)
class NetworkConfigList:
    """A network: its name, the spec version every plugin is called with, and the plugin configs.

    ``raw`` is the list's bytes as libcni keeps them (the file for a ``.conflist``, a synthesised
    one-plugin list for a ``.conf``): it is what the result cache stores as ``config``.
    """

    name: str
    cni_version: str
    plugins: tuple[dict[str, Any], ...]
    raw: bytes
    source: str = ""
    disable_check: bool = False
    disable_gc: bool = False


def parse_conflist(
    data: bytes, source: str = "network config", plugin_dir: str | None = None
) -> NetworkConfigList:
    """Parse a ``.conflist``. ``plugin_dir``: where plugins of a list without inline ones are read."""
    raw = _json_object(data, source)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise CniError(INVALID_CONFIG, f"{source}: field 'name' must be a non-empty string")
    cni_version = _list_version(raw, source)
    inline_only = _bool_field(raw, "loadOnlyInlinedPlugins", source)
    plugins: list[dict[str, Any]] = []
    if "plugins" in raw:
        entries = raw["plugins"]
        if not isinstance(entries, list) or not entries:
            raise CniError(INVALID_CONFIG, f"{source}: field 'plugins' must be a non-empty list")
        plugins = [_plugin(p, f"{source}: plugins[{i}]") for i, p in enumerate(entries)]
    elif inline_only:
        raise CniError(INVALID_CONFIG, f"{source}: loadOnlyInlinedPlugins is true but there is no 'plugins'")
    if plugin_dir is not None and not inline_only:
        plugins.extend(_plugins_from_dir(os.path.join(plugin_dir, name)))
    if not plugins:
        raise CniError(INVALID_CONFIG, f"{source}: network {name!r} has no plugins: add a 'plugins' list")
    return NetworkConfigList(
        name=name,
        cni_version=cni_version,
        plugins=tuple(plugins),
        raw=data,
        source=source,
        disable_check=_bool_field(raw, "disableCheck", source),
        disable_gc=_bool_field(raw, "disableGC", source),
    )


def parse_single(data: bytes, source: str = "network config") -> NetworkConfigList:
    """Parse a single-plugin ``.conf``/``.json`` and up-convert it to a one-plugin list like libcni."""
    plugin = _plugin(_json_object(data, source), source)
    name = plugin.get("name", "")
    version = plugin.get("cniVersion", "")
    if not isinstance(name, str) or not isinstance(version, str):
        raise CniError(INVALID_CONFIG, f"{source}: fields 'name' and 'cniVersion' must be strings")
    # libcni marshals a Go map here: keys sorted, compact; the cache stores exactly these bytes.
    synthesised = gojson.dumps({"cniVersion": version, "name": name, "plugins": [plugin]}).encode()
    return parse_conflist(synthesised, source)


def load(directory: str, name: str) -> NetworkConfigList:
    """Find network ``name`` in ``directory`` (lists first, then single configs), as libcni does."""
    seen: list[str] = []
    for path in _files(directory, LIST_EXTENSIONS):
        net = parse_conflist(_read(path), path, plugin_dir=directory)
        if net.name == name:
            return net
        seen.append(net.name)
    for path in _files(directory, SINGLE_EXTENSIONS):
        net = parse_single(_read(path), path)
        if net.name == name:
            return net
        seen.append(net.name)
    raise NetworkNotFound(directory, name, seen)


def capability_runtime_config(
    plugin: Mapping[str, Any], capability_args: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``runtimeConfig`` a plugin gets: the capability args it declares as enabled, nothing else."""
    caps = plugin.get("capabilities") or {}
    return {cap: capability_args[cap] for cap, enabled in caps.items() if enabled and cap in capability_args}


def plugin_stdin(
    net: NetworkConfigList,
    plugin: Mapping[str, Any],
    prev_result: Mapping[str, Any] | None = None,
    capability_args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON object one plugin of ``net`` is run with (ADD, CHECK, DEL)."""
    conf = dict(plugin)
    conf["name"] = net.name
    conf["cniVersion"] = net.cni_version
    if prev_result is not None:
        conf["prevResult"] = dict(prev_result)
    runtime = capability_runtime_config(plugin, capability_args or {})
    if runtime:
        conf["runtimeConfig"] = runtime
    return conf


def gc_stdin(
    net: NetworkConfigList, plugin: Mapping[str, Any], valid_attachments: Sequence[tuple[str, str]] | None
) -> dict[str, Any]:
    """The JSON object for GC (1.1): name, version and, when given, ``cni.dev/valid-attachments``."""
    conf = dict(plugin)
    conf["name"] = net.name
    conf["cniVersion"] = net.cni_version
    if valid_attachments is not None:
        conf["cni.dev/valid-attachments"] = [{"containerID": c, "ifname": i} for c, i in valid_attachments]
    return conf


def status_stdin(net: NetworkConfigList, plugin: Mapping[str, Any]) -> dict[str, Any]:
    conf = dict(plugin)
    conf["name"] = net.name
    conf["cniVersion"] = net.cni_version
    return conf


def convert_result(result: Mapping[str, Any], cni_version: str) -> dict[str, Any]:
    """A cached result in the list's version (libcni converts before passing it as prevResult)."""
    return render(parse_result(dict(result), what="cached result"), cni_version)


def _json_object(data: bytes, source: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CniError(INVALID_CONFIG, f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise CniError(INVALID_CONFIG, f"{source} must hold a JSON object")
    return obj


def _plugin(obj: Any, source: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise CniError(INVALID_CONFIG, f"{source} must be a JSON object")
    ptype = obj.get("type")
    if not isinstance(ptype, str) or not ptype:
        raise CniError(INVALID_CONFIG, f"{source}: field 'type' is missing: name the plugin binary")
    caps = obj.get("capabilities")
    if caps is not None and (
        not isinstance(caps, dict) or not all(isinstance(v, bool) for v in caps.values())
    ):
        raise CniError(INVALID_CONFIG, f"{source}: field 'capabilities' must map names to true/false")
    return obj


def _list_version(raw: Mapping[str, Any], source: str) -> str:
    version = raw.get("cniVersion", "")
    if not isinstance(version, str):
        raise CniError(INVALID_CONFIG, f"{source}: field 'cniVersion' must be a string such as \"1.0.0\"")
    if "cniVersions" not in raw:
        return version
    versions = raw["cniVersions"]
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        raise CniError(INVALID_CONFIG, f"{source}: field 'cniVersions' must be a list of version strings")
    candidates = [v for v in [*versions, *([version] if version else [])] if _usable(v, source)]
    return max(candidates, key=cniver.parse) if candidates else version


def _usable(version: str, source: str) -> bool:
    try:
        return cniver.parse(version) <= cniver.parse(cniver.CURRENT)
    except ValueError as exc:
        raise CniError(INVALID_CONFIG, f"{source}: {exc}") from exc


def _bool_field(raw: Mapping[str, Any], key: str, source: str) -> bool:
    value = raw.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise CniError(INVALID_CONFIG, f"{source}: field {key!r} must be true or false")


def _plugins_from_dir(directory: str) -> list[dict[str, Any]]:
    return [_plugin(_json_object(_read(p), p), p) for p in _files(directory, (".conf",))]


def _files(directory: str, extensions: Sequence[str]) -> list[str]:
    """Regular files with one of ``extensions``, sorted; a missing dir has none (like libcni)."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot read config dir {directory}: {exc.strerror}") from exc
    out = []
    for n in names:
        path = os.path.join(directory, n)
        if os.path.splitext(n)[1] in extensions and not os.path.isdir(path):
            out.append(path)
    return out


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot read {path}: {exc.strerror}") from exc
