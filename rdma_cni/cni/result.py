"""The CNI result, modelled once and rendered in any spec version 0.3.0 - 1.1.0.

The model is a superset (the 1.1.0 shape); ``render`` drops or adds what each version's JSON has:
0.3.x/0.4.0 carry ``ips[].version``; only 1.1.0 has interface ``mtu``/``socketPath``/``pciID`` and
route ``mtu``/``advmss``/``priority``/``table``/``scope``. A route in a table other than main cannot be
said before 1.1.0, and listed without its table it would read as a main-table route that is not there:
older results leave such routes out (they are in the pod all the same). ``parse`` reads any of them back, so a
``prevResult`` or a delegate's answer can be converted to the version the runtime asked for.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.cni import version as cniver
from rdma_cni.cni.errors import INVALID_CONFIG, CniError

RT_TABLE_MAIN = 254  # what a route without ``table`` means


@dataclass
class Interface:
    """An entry of a result's ``interfaces``; ``sandbox`` is the netns path of a link in the container."""

    name: str
    mac: str = ""
    mtu: int = 0
    sandbox: str = ""
    socket_path: str = ""
    pci_id: str = ""


@dataclass
class IPConfig:
    """An entry of a result's ``ips``; ``interface`` is an index into ``interfaces``."""

    address: str  # CIDR, e.g. "198.51.100.2/28"
    gateway: str = ""
    interface: int | None = None

    @property
    def family(self) -> str:
        return "6" if ":" in self.address else "4"


@dataclass
class Route:
    """An entry of a result's ``routes`` (``table`` None: the main table)."""

    dst: str
    gw: str = ""
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None


@dataclass
class DNS:
    """A result's ``dns``."""

    nameservers: list[str] = field(default_factory=list)
    domain: str = ""
    search: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)


@dataclass
class Result:
    """A CNI result: what ADD prints, and what DEL and CHECK get back as ``prevResult``."""

    interfaces: list[Interface] = field(default_factory=list)
    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)

    def merge(self, other: Result) -> None:
        """Append ``other``'s interfaces, IPs and routes, re-pointing its interface indexes."""
        offset = len(self.interfaces)
        self.interfaces.extend(other.interfaces)
        for ip in other.ips:
            idx = None if ip.interface is None else ip.interface + offset
            self.ips.append(IPConfig(ip.address, ip.gateway, idx))
        self.routes.extend(other.routes)


def render(result: Result, version: str) -> dict[str, Any]:
    """The JSON object for ``version``; raises ``ValueError`` for a version not in SUPPORTED."""
    if not cniver.is_supported(version):
        raise ValueError(f"cannot render a result in cniVersion {version}")
    v11 = version == "1.1.0"
    legacy = not cniver.at_least(version, "1.0.0")
    out: dict[str, Any] = {"cniVersion": version}
    if result.interfaces:
        out["interfaces"] = [_render_interface(i, v11) for i in result.interfaces]
    if result.ips:
        out["ips"] = [_render_ip(ip, legacy) for ip in result.ips]
    listed = [r for r in result.routes if v11 or r.table in (None, RT_TABLE_MAIN)]
    if listed:
        out["routes"] = [_render_route(r, v11) for r in listed]
    out["dns"] = _render_dns(result.dns)
    return out


def _render_interface(i: Interface, v11: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"name": i.name}
    if i.mac:
        d["mac"] = i.mac
    if v11 and i.mtu:
        d["mtu"] = i.mtu
    if i.sandbox:
        d["sandbox"] = i.sandbox
    if v11 and i.socket_path:
        d["socketPath"] = i.socket_path
    if v11 and i.pci_id:
        d["pciID"] = i.pci_id
    return d


def _render_ip(ip: IPConfig, legacy: bool) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if legacy:
        d["version"] = ip.family
    if ip.interface is not None:
        d["interface"] = ip.interface
    d["address"] = ip.address
    if ip.gateway:
        d["gateway"] = ip.gateway
    return d


def _render_route(r: Route, v11: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"dst": r.dst}
    if r.gw:
        d["gw"] = r.gw
    if v11:
        for key, value in (("mtu", r.mtu), ("advmss", r.advmss), ("priority", r.priority)):
            if value:
                d[key] = value
        if r.table is not None:
            d["table"] = r.table
        if r.scope is not None:
            d["scope"] = r.scope
    return d


def _render_dns(dns: DNS) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if dns.nameservers:
        d["nameservers"] = list(dns.nameservers)
    if dns.domain:
        d["domain"] = dns.domain
    if dns.search:
        d["search"] = list(dns.search)
    if dns.options:
        d["options"] = list(dns.options)
    return d


def parse(data: Any, what: str = "prevResult") -> Result:
    """Read a result of any supported version; errors name ``what`` and the bad field (code 7)."""
    if not isinstance(data, dict):
        raise CniError(INVALID_CONFIG, f"{what} must be a JSON object")
    try:
        return Result(
            interfaces=[_parse_interface(i) for i in _list(data, "interfaces")],
            ips=[_parse_ip(i) for i in _list(data, "ips")],
            routes=[_parse_route(r) for r in _list(data, "routes")],
            dns=_parse_dns({} if data.get("dns") is None else data["dns"]),
        )
    except (TypeError, ValueError, KeyError) as exc:
        raise CniError(INVALID_CONFIG, f"{what} is not a valid CNI result: {exc}") from exc


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"'{key}' must be a list")
    return value


def _str(d: dict[str, Any], key: str, default: str = "") -> str:
    value = d.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise TypeError(f"'{key}' must be a string")
    return value


def _opt_int(d: dict[str, Any], key: str) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{key}' must be an integer")
    return value


def _parse_interface(d: Any) -> Interface:
    if not isinstance(d, dict):
        raise TypeError("each of 'interfaces' must be an object")
    return Interface(
        name=_str(d, "name"),
        mac=_str(d, "mac"),
        mtu=_opt_int(d, "mtu") or 0,
        sandbox=_str(d, "sandbox"),
        socket_path=_str(d, "socketPath"),
        pci_id=_str(d, "pciID"),
    )


def _parse_ip(d: Any) -> IPConfig:
    if not isinstance(d, dict):
        raise TypeError("each of 'ips' must be an object")
    address = _str(d, "address")
    if "/" not in address:
        raise ValueError(f"'ips[].address' {address!r} must be in CIDR form, e.g. 198.51.100.2/24")
    try:
        ipaddress.ip_interface(address)
    except ValueError as exc:
        raise ValueError(f"'ips[].address' {address!r} is not an IP address with prefix") from exc
    gateway = _str(d, "gateway")
    if gateway:
        _check_ip(gateway, "ips[].gateway")
    return IPConfig(address=address, gateway=gateway, interface=_opt_int(d, "interface"))


def _parse_route(d: Any) -> Route:
    if not isinstance(d, dict):
        raise TypeError("each of 'routes' must be an object")
    dst = _str(d, "dst")
    try:
        ipaddress.ip_network(dst, strict=False)
    except ValueError as exc:
        raise ValueError(f"'routes[].dst' {dst!r} is not a network in CIDR form") from exc
    gw = _str(d, "gw")
    if gw:
        _check_ip(gw, "routes[].gw")
    return Route(
        dst=dst,
        gw=gw,
        mtu=_opt_int(d, "mtu") or 0,
        advmss=_opt_int(d, "advmss") or 0,
        priority=_opt_int(d, "priority") or 0,
        table=_opt_int(d, "table"),
        scope=_opt_int(d, "scope"),
    )


def _parse_dns(d: Any) -> DNS:
    if not isinstance(d, dict):
        raise TypeError("'dns' must be an object")
    return DNS(
        nameservers=_str_list(d, "nameservers"),
        domain=_str(d, "domain"),
        search=_str_list(d, "search"),
        options=_str_list(d, "options"),
    )


def _check_ip(value: str, what: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError as exc:
        raise ValueError(f"'{what}' {value!r} is not an IP address") from exc


def _str_list(d: dict[str, Any], key: str) -> list[str]:
    value = d.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise TypeError(f"'dns.{key}' must be a list of strings")
    return list(value)
