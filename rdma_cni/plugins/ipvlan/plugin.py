"""rdma-ipvlan: each verb, top to bottom (the policy; mechanisms live in ``net``, ``rdma``, ``state``).

ADD: config -> the attachment's claim -> every master read (its link, subnet, addresses, routes)
-> node lock -> the pod's addresses chosen (:mod:`.pool`, against what the records hold) and
written ahead -> node lock released -> per bond: a child in the pod netns, its address, the bond's
table, the GID (:mod:`.tx`) -> commit -> result. A failure anywhere undoes every bond and frees the
addresses, naming the step and the bond; the host bond is never changed.
DEL (the claim only): record -> the pod's children and rules deleted (if that netns is still the
recorded one) -> GID records -> record removed (the addresses are free from here). Works without
the pod netns, without state, twice. GC: DEL for every recorded attachment the runtime no longer
lists. STATUS: could an ADD succeed now (a master that exists, holds a subnet, has a free address).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rdma_cni import log as logconf
from rdma_cni import node_policy
from rdma_cni.attachments import PHASE_ADDED, AttachmentRecord, BondRecord
from rdma_cni.cni.errors import (
    CHECK_FAILED,
    GID_TIMEOUT,
    INVALID_CONFIG,
    INVALID_ENV,
    NETLINK_FAILURE,
    STATUS_UNAVAILABLE,
    TRY_AGAIN_LATER,
    CniError,
)
from rdma_cni.cni.request import Attachment, Request
from rdma_cni.cni.result import Interface, IPConfig, Result, Route
from rdma_cni.delegate_config import bonds, bounded_masters
from rdma_cni.failpoints import Failpoints
from rdma_cni.net import addresses, links, pod_routing, routes
from rdma_cni.net.netns import netlink_in, netns_inode, open_netns
from rdma_cni.net.nlsock import RtnlSocket
from rdma_cni.net.pod_links import pick_link_group
from rdma_cni.net.rtnl import Record, attr
from rdma_cni.plugins.ipvlan import tx
from rdma_cni.plugins.ipvlan.allocation import bond_subnets, held_addresses, no_ipv4, node_wide
from rdma_cni.plugins.ipvlan.config import Pools, check_ranges, parse_config, parse_del_config
from rdma_cni.plugins.ipvlan.pool import IPAddress, Subnet, choose, free_count
from rdma_cni.rdma import gid, mode, records, sysfs
from rdma_cni.state import NodeState

if TYPE_CHECKING:
    from rdma_cni.plugins.ipvlan.model import IpvlanConfig

log = logging.getLogger("rdma_cni.ipvlan")

RECORD_MODE = "shared"  # the GID records' mode: the pod's own address, its own (dynamic) index


@dataclass
class BondView:
    """One master as read before the node lock: what the choice and the plan need of it."""

    link: links.Link
    subnets: list[tuple[Subnet, int]]  # (subnet, prefix length): IPv4 first, then a global IPv6
    routes: list[Record] = field(default_factory=list)


PLUGIN = "rdma-ipvlan"


def _config(req: Request) -> tuple[IpvlanConfig, Pools]:
    """ADD/CHECK/STATUS: the config read through the node's policy, which refuses (7) any key that
    would widen what the node decided (:mod:`rdma_cni.node_policy`), before anything is touched."""
    policy = node_policy.load(req.env)
    cfg, pools = parse_config(policy.narrow(req.config, PLUGIN))
    logconf.configure(cfg.log_file, cfg.log_level)
    masters = bounded_masters(policy, cfg.masters, cfg.sysfs_root)
    return (cfg if masters is cfg.masters else dataclasses.replace(cfg, masters=masters)), pools


def _cleanup_config(req: Request) -> IpvlanConfig:
    """DEL/GC: the node's paths whatever the config names; a bad key falls back to its default."""
    cfg, dropped = parse_del_config(node_policy.load(req.env).narrow(req.config, PLUGIN, cleanup=True))
    logconf.configure(cfg.log_file, cfg.log_level)
    for problem in dropped:
        log.warning(
            "%s %s/%s: %s; using its default to clean up", req.command, req.container_id, req.ifname, problem
        )
    return cfg


class IpvlanPlugin:
    """The verbs. Stateless between calls: the records in ``dataDir`` are the allocation."""

    # ---------------------------------------------------------------- ADD
    def add(self, req: Request) -> Result:
        cfg, pools = _config(req)
        fp = Failpoints(req.env)
        state = NodeState(cfg.data_dir)
        ns = open_netns(req.netns)
        with ns, state.claimed(req.attachment):
            host = netlink_in(None)
            pod = netlink_in(ns)
            try:
                old = state.get(req.container_id, req.ifname)
                if old is not None:  # a repeated ADD: the earlier one is undone first (its addresses freed)
                    log.warning(
                        "ADD %s/%s: a previous attachment is recorded; undoing it first",
                        req.container_id,
                        req.ifname,
                    )
                    self._forget(cfg, state, old, req.netns)
                ports = sysfs.list_ports(cfg.sysfs_root)
                views = self._read_bonds(cfg, pools, host, pod, req, ports)
                with state.locked():
                    fp.hit("locked")
                    rec = self._write_ahead(req, cfg, pools, state, views, ns.inode, ports)
                ctx = tx.AddContext(
                    host=host,
                    ns=ns,
                    pod=pod,
                    rec=rec,
                    fp=fp,
                    link=cfg.link,
                    ipvlan_mode=cfg.ipvlan_mode,
                    rdma_step=lambda b: _attach_rdma(cfg, rec, b),
                )
                return self._transact(req, cfg, state, rec, ctx)
            finally:
                pod.close()
                host.close()

    def _read_bonds(
        self,
        cfg: IpvlanConfig,
        pools: Pools,
        host: RtnlSocket,
        pod: RtnlSocket,
        req: Request,
        ports: list[sysfs.RdmaPort],
    ) -> list[BondView]:
        """Every master, read once before the node lock (nothing here changes them: the host bond
        is never touched by this plugin); a bad one is error 7 naming it, nothing changed."""
        views = []
        for name in _masters(cfg, ports):
            link = links.master_link(host, name)
            mtu = cfg.mtu or link.mtu
            if mtu > link.mtu:
                raise CniError(
                    INVALID_CONFIG, f"config key 'mtu' ({mtu}) exceeds {name}'s MTU {link.mtu}: lower it"
                )
            if links.get_link(pod, name) is not None:
                raise CniError(INVALID_ENV, f"interface {name} already exists in {req.netns}")
            views.append(BondView(link=link, subnets=[]))
        held = addresses.snapshots(host, {v.link.index for v in views})
        found = routes.snapshot_routes_of(
            host, [(v.link.index, {addresses.ip_of(a) for a in held[v.link.index]}) for v in views]
        )
        # Two bonds on one subnet (one L2 segment) must not give a pod an address the other bond holds.
        node_own = {ipaddress.ip_address(addresses.ip_of(a)) for recs in held.values() for a in recs}
        for v, bond_routes in zip(views, found, strict=True):
            v.routes = bond_routes
            v.subnets = [
                (dataclasses.replace(sub, reserved=sub.reserved | node_own), plen)
                for sub, plen in bond_subnets(v.link.name, held[v.link.index], bond_routes)
            ]
            if not v.subnets:
                raise no_ipv4(v.link.name)
            for subnet, _ in v.subnets:
                check_ranges(subnet, pools.ranges.get(v.link.name, []))
        return views

    def _write_ahead(
        self,
        req: Request,
        cfg: IpvlanConfig,
        pools: Pools,
        state: NodeState,
        views: list[BondView],
        inode: int,
        ports: list[sysfs.RdmaPort],
    ) -> AttachmentRecord:
        """Under the node lock: choose each bond's pod addresses against what every record holds
        and record them (the write-ahead record: from here they are held, until DEL frees them)."""
        held = held_addresses(state)
        rec = AttachmentRecord(
            container_id=req.container_id,
            ifname=req.ifname,
            netns=req.netns,
            netns_inode=inode,
            cni_version=req.cni_version,
            network=req.name,
            pod_namespace=req.args.get("K8S_POD_NAMESPACE", ""),
            pod_name=req.args.get("K8S_POD_NAME", ""),
        )
        for v in views:
            chosen = []
            for subnet, plen in v.subnets:
                ip = self._choose(req, cfg, pools, state, subnet, held)
                held[subnet.bond][ip] = req.attachment
                chosen.append(tx.pod_address(str(ip), plen))
            rec.bonds.append(
                BondRecord(
                    bond=v.link.name,
                    bond_index=v.link.index,
                    pod_ifname=v.link.name,
                    temp_name=tx.temp_name(),
                    mtu=cfg.mtu or v.link.mtu,
                    addresses=chosen,
                    routes=v.routes,
                    moves_addresses=False,
                )
            )
        _plan_rdma(cfg, rec, ports)
        state.put(rec, sync=False)  # holds the addresses; synced before the pod is touched
        return rec

    def _choose(
        self,
        req: Request,
        cfg: IpvlanConfig,
        pools: Pools,
        state: NodeState,
        subnet: Subnet,
        held: dict[str, dict[IPAddress, Attachment]],
    ) -> IPAddress:
        spans = pools.ranges.get(subnet.bond, [])
        ip = choose(subnet, spans, pools.exclude, node_wide(held))
        if ip is None and self._reclaim_dead(req, cfg, state):
            ours = [
                (bond, a) for bond, per in held.items() for a, att in per.items() if att == req.attachment
            ]
            held.clear()
            held.update(held_addresses(state))
            for bond, a in ours:  # what this ADD chose for its earlier bonds is not on disk yet
                held[bond][a] = req.attachment
            ip = choose(subnet, spans, pools.exclude, node_wide(held))
        if ip is not None:
            return ip
        net = subnet.network
        pods = {att for ip_, att in node_wide(held).items() if ip_ in net}
        where = f" within ranges {', '.join(s.describe() for s in spans)}" if spans else ""
        raise CniError(
            TRY_AGAIN_LATER,
            f"no free address on {subnet.bond} in its subnet {net}{where}: {len(pods)} pod(s) hold addresses "
            "in it",
            "widen the bond's subnet (shared mode wants /28 or wider) or its 'ranges', shrink 'exclude', "
            "or wait for pods to go (DEL/GC frees their addresses)",
        )

    def _reclaim_dead(self, req: Request, cfg: IpvlanConfig, state: NodeState) -> bool:
        """A full subnet: free the addresses of attachments whose netns is gone (their DEL or GC
        has not come yet), skipping any whose ADD or DEL is in flight. True when one was freed."""
        freed = False
        for rec in state.attachments():
            if rec.key == req.attachment or netns_inode(rec.netns) == rec.netns_inode:
                continue
            with state.try_claim(rec.key) as free:
                if not free:
                    continue
                log.warning(
                    "freeing the addresses of %s/%s: its netns %s is gone",
                    rec.container_id,
                    rec.ifname,
                    rec.netns,
                )
                try:
                    self._forget(cfg, state, rec, "")
                    freed = True
                except (CniError, OSError) as exc:
                    log.error("could not free %s/%s: %s", rec.container_id, rec.ifname, exc)
        return freed

    def _transact(
        self, req: Request, cfg: IpvlanConfig, state: NodeState, rec: AttachmentRecord, ctx: tx.AddContext
    ) -> Result:
        step = ["write-ahead"]
        current = rec.bonds[0].bond if rec.bonds else "-"
        try:
            tx.plan_pod_routing(ctx.pod, rec)
            rec.link_group = pick_link_group(rec, links.all_links(ctx.pod))
            state.put(rec, sync=False)  # our claim is enough for this write (state module doc)
            state.sync(rec)  # on disk before the pod is touched
            ctx.fp.hit("write-ahead")
            for b in rec.bonds:
                current = b.bond
                tx.add_bond(ctx, b, step)
            rec.phase = PHASE_ADDED
            state.commit(rec)
            ctx.fp.hit("committed")
        except BaseException as exc:
            self._rollback(cfg, state, rec, req.netns)
            if isinstance(exc, CniError):
                exc.msg = f"ADD failed at step '{step[0]}' for {current}: {exc.msg} (nothing left behind)"
                exc.args = (exc.msg,)
                raise
            if not isinstance(exc, Exception):
                raise
            raise CniError(
                NETLINK_FAILURE, f"ADD failed at step '{step[0]}' for {current}: {exc} (nothing left behind)"
            ) from exc
        return _result(req, rec)

    def _rollback(self, cfg: IpvlanConfig, state: NodeState, rec: AttachmentRecord, netns: str) -> None:
        try:
            self._forget(cfg, state, rec, netns)
        except Exception:  # the record stays (its addresses held); DEL/GC will finish the job
            log.exception("rollback of %s/%s incomplete; state kept for DEL/GC", rec.container_id, rec.ifname)

    def _forget(
        self,
        cfg: IpvlanConfig,
        state: NodeState,
        rec: AttachmentRecord,
        netns_path: str,
        fp: Failpoints | None = None,
    ) -> None:
        """Undo one recorded attachment, then drop its record: that frees its addresses, after the
        interfaces that held them are gone."""
        tx.teardown(rec, netns_path, fp, detach=lambda b: _detach_rdma(cfg, rec, b))
        state.remove(rec.container_id, rec.ifname)

    # ---------------------------------------------------------------- DEL
    def delete(self, req: Request) -> None:
        cfg = _cleanup_config(req)
        fp = Failpoints(req.env)
        state = NodeState(cfg.data_dir)
        with state.claimed(req.attachment):
            fp.hit("del-locked")
            rec = state.get(req.container_id, req.ifname)
            if rec is None:
                log.info("DEL %s/%s: nothing recorded", req.container_id, req.ifname)
                state.sweep()  # an ADD killed while writing its write-ahead record left a temp file
                return
            self._forget(cfg, state, rec, req.netns, fp)

    # ---------------------------------------------------------------- CHECK
    def check(self, req: Request) -> None:
        cfg, _ = _config(req)
        state = NodeState(cfg.data_dir)
        rec = state.get(req.container_id, req.ifname)
        if rec is None or rec.phase != PHASE_ADDED:
            raise CniError(CHECK_FAILED, f"no completed ADD is recorded for {req.container_id}/{req.ifname}")
        ns = open_netns(req.netns)
        with ns:
            if ns.inode != rec.netns_inode:
                raise CniError(CHECK_FAILED, f"{req.netns} is not the netns recorded at ADD")
            pod = netlink_in(ns)
            try:
                for b in rec.bonds:
                    _check_bond(pod, b, cfg.link)
            finally:
                pod.close()

    # ---------------------------------------------------------------- GC
    def gc(self, req: Request) -> None:
        cfg = _cleanup_config(req)
        if req.valid_attachments is None:
            raise CniError(INVALID_CONFIG, "GC needs 'cni.dev/valid-attachments' (the runtime's live list)")
        valid = set(req.valid_attachments)
        state = NodeState(cfg.data_dir)
        fp = Failpoints(req.env)
        failures: list[str] = []
        with state.locked():
            fp.hit("del-locked")
            for rec in state.attachments():
                if rec.key in valid:
                    continue
                with state.try_claim(rec.key) as free:
                    if not free:  # its ADD is still running (the runtime may not list it yet)
                        log.info(
                            "GC: %s/%s is in flight: left for its own DEL or the next GC",
                            rec.container_id,
                            rec.ifname,
                        )
                        continue
                    log.info(
                        "GC: %s/%s is not in the valid list: freeing %s",
                        rec.container_id,
                        rec.ifname,
                        ", ".join(tx.describe(b) for b in rec.bonds),
                    )
                    try:
                        self._forget(cfg, state, rec, "", fp)
                    except (CniError, OSError) as exc:
                        failures.append(f"{rec.container_id}/{rec.ifname}: {exc}")
        if failures:
            raise CniError(NETLINK_FAILURE, "GC could not clean up: " + "; ".join(failures))

    # ---------------------------------------------------------------- STATUS
    def status(self, req: Request) -> None:
        cfg, pools = _config(req)
        state = NodeState(cfg.data_dir)
        try:
            state.ensure()
            if not os.access(cfg.data_dir, os.W_OK):
                raise OSError(f"{cfg.data_dir} is not writable")
        except OSError as exc:
            raise CniError(STATUS_UNAVAILABLE, f"state dir unusable: {exc}") from exc
        ports = sysfs.list_ports(cfg.sysfs_root)
        masters = _masters(cfg, ports)
        held = held_addresses(state)
        host = netlink_in(None)
        reasons = []
        try:
            index = {m: links.get_link(host, m) for m in masters}
            known = {link.index for link in index.values() if link is not None}
            snaps = addresses.snapshots(host, known)
            for m, link in index.items():
                if link is None:
                    raise CniError(
                        INVALID_CONFIG,
                        f"config key 'masters' names {m!r}, but it does not exist "
                        "on this node: list the node's bond netdevs (`ip link`)",
                    )
                subnets = bond_subnets(m, snaps[link.index], [])
                if not subnets:
                    reasons.append(no_ipv4(m).msg)
                for subnet, _ in subnets:
                    if free_count(subnet, pools.ranges.get(m, []), pools.exclude, node_wide(held)) <= 0:
                        reasons.append(f"{m}'s subnet {subnet.network} has no free address")
        finally:
            host.close()
        if reasons:
            raise CniError(STATUS_UNAVAILABLE, "an ADD cannot succeed now: " + "; ".join(reasons))


def _masters(cfg: IpvlanConfig, ports: list[sysfs.RdmaPort]) -> list[str]:
    return bonds(cfg.masters, cfg.sysfs_root, ports)


def _plan_rdma(cfg: IpvlanConfig, rec: AttachmentRecord, ports: list[sysfs.RdmaPort]) -> None:
    """Which RDMA port serves each bond (recorded write-ahead, so DEL knows which records to drop);
    a bond without one is an error only with ``rdma.required``."""
    # every pod sees every device: the kernel's RDMA netns mode must be shared
    names = [b.bond for b in rec.bonds]
    found = mode.bond_ports(cfg.sysfs_root, names, ports, cfg.rdma.required, mode.SHARED)
    for b in rec.bonds:
        port = found.get(b.bond)
        if port is None:
            continue
        b.rdma = {"device": port.device, "port": port.port, "uverbs": port.uverbs, "mode": RECORD_MODE}


def _attach_rdma(cfg: IpvlanConfig, rec: AttachmentRecord, b: BondRecord) -> None:
    """After the pod's address is up: wait (bounded) for its RoCE v2 GID in the shared table and
    record its index; with ``rdma.required`` a GID that never comes fails the ADD (rolled back)."""
    info = b.rdma
    if info is None:
        return
    found: dict[str, sysfs.GidEntry] = {}
    for a in b.addresses:
        ip = addresses.ip_of(a)
        try:
            found[ip] = gid.wait_for_gid(
                cfg.sysfs_root, info["device"], info["port"], ip, cfg.rdma.gid_timeout_ms, ndev=b.pod_ifname
            )
        except CniError as exc:
            if exc.code != GID_TIMEOUT or cfg.rdma.required:
                raise
            log.warning(
                "%s: %s; recorded without a GID index (rdma.required is false)", b.pod_ifname, exc.msg
            )
    v4 = next((e for ip, e in found.items() if ":" not in ip), None)
    v6 = next((e for ip, e in found.items() if ":" in ip), None)
    if v4 is not None:
        info["podGidIndex"] = v4.index
    if v6 is not None:
        info["podGidIndexIPv6"] = v6.index
    if v4 or v6:
        records.write_pod_record(
            cfg.run_dir, rec.container_id, b.pod_ifname, v4, info["uverbs"], v6, mode=RECORD_MODE
        )


def _detach_rdma(cfg: IpvlanConfig, rec: AttachmentRecord, b: BondRecord) -> None:
    if b.rdma is not None:
        records.remove_pod_records(cfg.run_dir, rec.container_id, b.pod_ifname)


def _result(req: Request, rec: AttachmentRecord) -> Result:
    res = Result()
    for i, b in enumerate(rec.bonds):
        res.interfaces.append(Interface(name=b.pod_ifname, mac=b.mac, mtu=b.mtu, sandbox=req.netns))
        for a in b.addresses:
            res.ips.append(IPConfig(addresses.cidr(a), tx.result_gateway(b, a), i))
        for r in b.pod_routes:
            subnet = not attr(r, "RTA_GATEWAY") and attr(r, "RTA_TABLE") == routes.RT_TABLE_MAIN
            if not subnet or r["dst_len"] == 0:
                res.routes.append(_route_of(r))
    return res


def _route_of(r: Record) -> Route:
    dst = attr(r, "RTA_DST") or ("0.0.0.0" if r["family"] == 2 else "::")
    table = attr(r, "RTA_TABLE", r["table"])
    return Route(
        dst=f"{dst}/{r['dst_len']}",
        gw=attr(r, "RTA_GATEWAY") or "",
        priority=attr(r, "RTA_PRIORITY") or 0,
        table=None if table == routes.RT_TABLE_MAIN else table,
    )


def _check_bond(pod: RtnlSocket, b: BondRecord, kind: str) -> None:
    """Compare one pod child with what ADD recorded: link, MTU, up, addresses, routes, rules."""
    link = links.get_link(pod, b.pod_ifname)
    if link is None or link.kind not in tx.KINDS:
        raise CniError(CHECK_FAILED, f"pod interface {b.pod_ifname} is missing")
    if link.kind != kind:
        raise CniError(CHECK_FAILED, f"pod interface {b.pod_ifname} is a {link.kind}, the config says {kind}")
    if link.mtu != b.mtu:
        raise CniError(CHECK_FAILED, f"{b.pod_ifname} MTU is {link.mtu}, recorded {b.mtu}")
    if not link.up:
        raise CniError(CHECK_FAILED, f"{b.pod_ifname} is down")
    live = set(addresses.live_cidrs(pod, link.index))
    for a in b.addresses:
        if addresses.cidr(a) not in live:
            raise CniError(CHECK_FAILED, f"{addresses.cidr(a)} is missing from {b.pod_ifname}")
    have = {routes.route_key(r) for r in routes.live_routes(pod, link.index)}
    for r in b.pod_routes:
        if routes.route_key(r) not in have:
            raise CniError(CHECK_FAILED, f"route {routes.describe_route(r)} is missing in the pod")
    rules = pod_routing.live_rule_keys(pod, [r["family"] for r in b.pod_rules])
    for r in b.pod_rules:
        if pod_routing.rule_key(r) not in rules:
            raise CniError(
                CHECK_FAILED,
                f"rule from {attr(r, 'FRA_SRC')} lookup {attr(r, 'FRA_TABLE')} is missing in the pod",
            )
