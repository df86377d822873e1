"""rdma-macvlan: each verb, top to bottom (the policy; mechanisms live in ``net``, ``rdma``, ``state``).

ADD: config -> the attachment's claim -> node lock -> pick bonds -> write-ahead record -> node lock
released -> per bond: macvlan in the pod netns, the bond's addresses moved into it, routes, RDMA
checks, announcements -> commit (node lock again, briefly) -> result (locking: :mod:`rdma_cni.state`).
A failure anywhere undoes every bond of the attachment (:func:`.tx.teardown`), naming the
step and the bond.
DEL (under the attachment's claim only): record -> pod interfaces deleted (if that netns is still
the recorded one) -> the bond's addresses, routes and rules replayed (not when the bond was
re-addressed meanwhile: its present configuration wins, noted for state/doctor) -> IPAM released
-> record removed. Works without the pod netns, without state, twice, and whatever is wrong with
the config or the IPAM plugin: our own undo always happens; an IPAM failure is reported after it,
with the record cut down to the IPAM part (no pins) for the retry. GC: DEL for every recorded
attachment the runtime no longer lists. STATUS: could an ADD succeed now. See
:mod:`rdma_cni.plugins.macvlan.tx` for the step order and the test failpoints.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import re
import time
from typing import TYPE_CHECKING, Any

from rdma_cni import log as logconf
from rdma_cni import node_policy
from rdma_cni.attachments import PHASE_ADDED, PHASE_IPAM_PENDING, AttachmentRecord, BondRecord, SkippedRestore
from rdma_cni.cni import invoke
from rdma_cni.cni.errors import (
    CHECK_FAILED,
    INVALID_CONFIG,
    INVALID_ENV,
    IO_FAILURE,
    NETLINK_FAILURE,
    STATUS_UNAVAILABLE,
    CniError,
)
from rdma_cni.cni.request import Request
from rdma_cni.cni.result import Interface, IPConfig, Result, Route
from rdma_cni.cni.result import parse as parse_result
from rdma_cni.delegate_config import StatusConfig, bonds, bounded_masters, parse_status_config
from rdma_cni.net import addresses, links, pod_routing, routes
from rdma_cni.net.netns import netlink_in, netns_inode, open_netns
from rdma_cni.net.rtnl import attr
from rdma_cni.plugins.macvlan import rdma as macvlan_rdma
from rdma_cni.plugins.macvlan import tx
from rdma_cni.plugins.macvlan.config import parse_config, parse_del_config
from rdma_cni.plugins.macvlan.model import DEFAULT_DATA_DIR
from rdma_cni.plugins.macvlan.select import (
    PinnedElsewhere,
    choose_bonds,
    describe_pins,
    kubelet_view,
)
from rdma_cni.rdma import sysfs
from rdma_cni.rdma.mode import require_mode
from rdma_cni.state import NodeState

if TYPE_CHECKING:
    from rdma_cni.kube.allocated import DeviceHolders
    from rdma_cni.plugins.macvlan.model import MacvlanConfig

log = logging.getLogger("rdma_cni.macvlan")

KNOWN_ARGS = frozenset({"MAC"})
PINNED_LOOK_S = 0.1  # how often ADD looks again for a named bond's pin to clear


PLUGIN = "rdma-macvlan"


def _config(req: Request) -> MacvlanConfig:
    return _add_config(req)[0]


def _add_config(req: Request) -> tuple[MacvlanConfig, node_policy.NodePolicy]:
    """ADD/CHECK: the config read through the node's policy, which refuses (7) any key that would
    widen what the node decided (:mod:`rdma_cni.node_policy`), before anything is touched."""
    policy = node_policy.load(req.env)
    cfg = parse_config(policy.narrow(req.config, PLUGIN))
    logconf.configure(cfg.log_file, cfg.log_level)
    policy.check_resource(cfg.resource_name)
    masters = bounded_masters(policy, cfg.masters, cfg.sysfs_root)
    return (cfg if masters is cfg.masters else dataclasses.replace(cfg, masters=masters)), policy


def _cleanup_config(req: Request) -> MacvlanConfig:
    """DEL/GC: a config problem must not keep the host from getting its bonds back (see
    :func:`parse_del_config`); what was left out is logged. The node's paths, whatever the config
    names (:meth:`.NodePolicy.narrow` with ``cleanup``)."""
    raw = node_policy.load(req.env).narrow(req.config, PLUGIN, cleanup=True)
    cfg, dropped = parse_del_config(raw)
    logconf.configure(cfg.log_file, cfg.log_level)
    for problem in dropped:
        log.warning("%s %s/%s: %s; using its default to clean up", req.command, req.container_id,
                    req.ifname, problem)
    return cfg


class MacvlanPlugin:
    """The verbs. Stateless between calls: everything durable is in :class:`NodeState`."""

    # ---------------------------------------------------------------- ADD
    def add(self, req: Request) -> Result:
        cfg, policy = _add_config(req)
        fp = tx.Failpoints(req.env)
        state = NodeState(cfg.data_dir)
        ns = open_netns(req.netns)
        with ns, state.claimed(req.attachment):
            host = netlink_in(None)
            pod = netlink_in(ns)
            try:
                # Before the node lock (every other ADD of the node waits for it): the config's
                # bonds are looked up and checked once, here.
                known = _configured_masters(host, cfg.masters) if cfg.masters else {}
                kubelet = kubelet_view(req, cfg, policy)  # a gRPC question: never under the node lock
                rec, ctx = self._write_ahead_when_unpinned(req, cfg, state, fp, host, pod, ns, known, kubelet)
                return self._transact(req, cfg, state, rec, ctx)
            finally:
                pod.close()
                host.close()

    def _write_ahead_when_unpinned(
        self, req: Request, cfg: MacvlanConfig, state: NodeState, fp: tx.Failpoints, host: Any, pod: Any,
        ns: Any, known: dict[str, links.Link], kubelet: DeviceHolders | None,
    ) -> tuple[AttachmentRecord, tx.AddContext]:
        """:meth:`_write_ahead`, again while a bond the device IDs name is still pinned to another
        container, for up to ``pinnedWaitMs``: the node lock is free between looks, so that
        container's DEL can unpin it."""
        deadline = time.monotonic() + cfg.pinned_wait_ms / 1000
        while True:
            try:
                with state.locked():
                    fp.hit("locked")
                    return self._write_ahead(req, cfg, state, fp, host, pod, ns, known, kubelet)
            except PinnedElsewhere as exc:
                if time.monotonic() >= deadline:
                    if cfg.pinned_wait_ms:
                        exc.msg = f"{exc.msg} (waited {cfg.pinned_wait_ms} ms for its DEL)"
                        exc.args = (exc.msg,)
                    raise
                log.info("ADD %s/%s waits: %s", req.container_id, req.ifname, exc.msg)
                time.sleep(PINNED_LOOK_S)

    def _write_ahead(
        self, req: Request, cfg: MacvlanConfig, state: NodeState, fp: tx.Failpoints, host: Any, pod: Any,
        ns: Any, known: dict[str, links.Link], kubelet: DeviceHolders | None = None,
    ) -> tuple[AttachmentRecord, tx.AddContext]:
        """Under the node lock: pick and pin the bonds, record how to give them back (write-ahead).
        The rest of the plan (routes, rules, the pod's tables, the link group) is read after the lock
        is released (:meth:`_plan_outside_lock`): every other ADD of the node waits for this lock."""
        old = state.get(req.container_id, req.ifname)
        if old is not None:
            log.warning("ADD %s/%s: a previous attachment is recorded; undoing it first", req.container_id,
                        req.ifname)
            try:
                self._forget(req, cfg, state, old, host, req.netns, locked=True)
            except CniError as exc:
                exc.msg = f"undoing the earlier ADD of {req.container_id}/{req.ifname}: {exc.msg}"
                exc.args = (exc.msg,)
                raise
        self._reclaim_dead(req, cfg, state, host)
        seen: dict[str, tuple[links.Link, list[dict[str, Any]]]] = {}
        ports = sysfs.list_ports(cfg.sysfs_root)  # once: default masters, device IDs and the RDMA plan
        bonds = self._pick_bonds(req, cfg, state, host, seen, known, ports, kubelet)
        rec = AttachmentRecord(
            container_id=req.container_id, ifname=req.ifname, netns=req.netns, netns_inode=ns.inode,
            cni_version=req.cni_version, network=req.name, ipam=cfg.ipam,
            pod_namespace=req.args.get("K8S_POD_NAMESPACE", ""), pod_name=req.args.get("K8S_POD_NAME", ""),
        )
        for i, bond in enumerate(bonds):
            rec.bonds.append(self._plan_bond(req, cfg, host, pod, bond, i, seen.get(bond)))
            state.clear_skipped(bond)  # handed out again with what it holds now: the old skip is history
            if addresses.has_deadlines(rec.bonds[-1].addresses):  # the first deadlines, not the last add's
                addresses.carry_deadlines(rec.bonds[-1].addresses, state.deadlines(bond))
        macvlan_rdma.plan(cfg, rec.bonds, ports)  # device, netns mode, host GID index: recorded write-ahead
        ctx = tx.AddContext(host=host, ns=ns, pod=pod, rec=rec, fp=fp, save=lambda: state.put(rec),
                            mode=cfg.mode, mac=_requested_mac(req))
        ctx.rdma_step = lambda b, i: macvlan_rdma.attach(cfg, rec, b, ns, _ipam_ipv4(ctx, i), ctx.save)
        state.put(rec, sync=False)  # pins the bonds; a crash from here is repaired by DEL/GC
        return rec, ctx

    def _plan_outside_lock(
        self, cfg: MacvlanConfig, state: NodeState, rec: AttachmentRecord, ctx: tx.AddContext
    ) -> None:
        """The write-ahead plan that needs no node lock: our pins keep every other ADD off these bonds
        (their routes and rules change only by us now), and the pod is this attachment's. Recorded
        before the host is touched; a crash before this record only leaves pins and the addresses,
        which the bonds still hold, for DEL/GC to give back."""
        tx.snapshot_routing(ctx.host, rec)
        tx.plan_pod_routing(ctx.pod, rec)  # which table: decided before the pod is touched, recorded
        rec.link_group = tx.pick_link_group(rec, links.all_links(ctx.pod))
        state.put(rec, sync=False)  # our claim is enough for this write (state module doc); synced next
        # While the host still holds our bonds' IPs (nobody else touches pinned bonds): host.json.
        macvlan_rdma.refresh_host_record(cfg, ctx.host)

    def _transact(
        self, req: Request, cfg: MacvlanConfig, state: NodeState, rec: AttachmentRecord, ctx: tx.AddContext
    ) -> Result:
        """Without the node lock (our claim and the pins in the record keep everyone else off these
        bonds): the kernel work, then the commit; any failure undoes it all."""
        fp, host = ctx.fp, ctx.host
        step = ["write-ahead"]
        current = rec.bonds[0].bond
        try:
            self._plan_outside_lock(cfg, state, rec, ctx)
            # On disk before the host is touched; outside the node lock, so that concurrent ADDs
            # do not queue behind each other's disk flush (our pins are visible already).
            state.sync(rec)
            fp.hit("write-ahead")
            step[0] = "IPAM"
            if cfg.ipam is not None:
                self._run_ipam(req, cfg, rec, ctx)
                ctx.save()
            fp.hit("ipam-added")
            for i, b in enumerate(rec.bonds):
                current = b.bond
                tx.add_bond(ctx, b, i, step)
            rec.phase = PHASE_ADDED
            state.commit(rec)  # under our claim alone, like every write of the record after the first
            fp.hit("committed")
            macvlan_rdma.refresh_host_record(cfg, host)
        except BaseException as exc:
            self._rollback(req, cfg, state, rec, host)
            if isinstance(exc, CniError):
                exc.msg = f"ADD failed at step '{step[0]}' for {current}: {exc.msg} (host restored)"
                exc.args = (exc.msg,)
                raise
            if not isinstance(exc, Exception):
                raise
            raise CniError(
                NETLINK_FAILURE, f"ADD failed at step '{step[0]}' for {current}: {exc} (host restored)"
            ) from exc
        return self._result(req, rec)

    def _pick_bonds(
        self, req: Request, cfg: MacvlanConfig, state: NodeState, host: Any,
        seen: dict[str, tuple[links.Link, list[dict[str, Any]]]], known: dict[str, links.Link],
        ports: list[sysfs.RdmaPort], kubelet: DeviceHolders | None,
    ) -> list[str]:
        """``seen`` collects what was read of each usable bond, so planning need not ask again;
        ``known``: the configured masters, looked up before the lock; ``ports``: the RDMA ports."""
        masters = self._masters(cfg, ports)
        held: dict[int, list[dict[str, Any]]] = {}  # the configured bonds' addresses: one dump for all

        def addresses_of(link: links.Link) -> list[dict[str, Any]]:
            if not held:
                held.update(addresses.snapshots(host, {m.index for m in known.values()} | {link.index}))
            return held[link.index] if link.index in held else addresses.snapshot(host, link.index)

        def usable(name: str) -> str:
            link = known[name] if name in known else links.get_link(host, name)
            if link is None:
                return "no such netdev on this node"
            addrs = addresses_of(link) if cfg.ipam is None else []
            if cfg.ipam is None and not addrs:
                return "it holds no IP address to move (and no pod holds it): give it back its address"
            seen[name] = (link, addrs)
            return ""

        root = cfg.sysfs_root

        def device_of(master: str) -> str | None:
            return macvlan_rdma.device_of(root, master, ports)

        return choose_bonds(req, masters, cfg.count, state.pins(), usable, device_of, root, kubelet)

    def _masters(
        self, cfg: MacvlanConfig | StatusConfig, ports: list[sysfs.RdmaPort] | None = None
    ) -> list[str]:
        return bonds(cfg.masters, cfg.sysfs_root, ports)

    def _plan_bond(
        self, req: Request, cfg: MacvlanConfig, host: Any, pod: Any, bond: str, i: int,
        seen: tuple[links.Link, list[dict[str, Any]]] | None,
    ) -> BondRecord:
        link = seen[0] if seen else links.get_link(host, bond)
        if link is None:
            raise CniError(INVALID_CONFIG, f"master {bond} does not exist on this node: fix 'masters'")
        mtu = cfg.mtu or link.mtu
        if mtu > link.mtu:
            raise CniError(
                INVALID_CONFIG, f"config key 'mtu' ({mtu}) exceeds {bond}'s MTU {link.mtu}: lower it"
            )
        name = bond if cfg.pod_if_name == "master" else (req.ifname if i == 0 else f"{req.ifname}_{i}")
        if len(name) > 15:
            raise CniError(INVALID_CONFIG, f"pod interface name {name!r} is longer than 15 characters")
        if links.get_link(pod, name) is not None:
            raise CniError(INVALID_ENV, f"interface {name} already exists in {req.netns}")
        addrs = seen[1] if seen else None
        return tx.snapshot_bond(host, link, name, mtu, moves=cfg.ipam is None, addrs=addrs)

    def _run_ipam(self, req: Request, cfg: MacvlanConfig, rec: AttachmentRecord, ctx: tx.AddContext) -> None:
        assert cfg.ipam is not None
        path = invoke.find_plugin(str(cfg.ipam["type"]), req.path)
        raw = invoke.exec_plugin(path, "ADD", req.env, req.stdin)
        rec.ipam_result = raw
        res = parse_result(raw or {}, "IPAM result")
        for ip in res.ips:
            iface = ip.interface if ip.interface is not None and ip.interface < len(rec.bonds) else 0
            net = ipaddress.ip_interface(ip.address)
            ctx.extra_ips.setdefault(iface, []).append((str(net.ip), net.network.prefixlen))
        ctx.ipam_routes = [(r.dst, r.gw) for r in res.routes]

    def _rollback(
        self, req: Request, cfg: MacvlanConfig, state: NodeState, rec: AttachmentRecord, host: Any
    ) -> None:
        try:
            self._forget(req, cfg, state, rec, host, req.netns)
        except Exception:  # the record (or its IPAM part) stays; DEL/GC will finish the job
            log.exception("rollback of %s/%s incomplete; state kept for DEL/GC", rec.container_id, rec.ifname)

    def _forget(
        self, req: Request, cfg: MacvlanConfig, state: NodeState, rec: AttachmentRecord, host: Any,
        netns_path: str, fp: tx.Failpoints | None = None, locked: bool = False,
    ) -> None:
        """Undo one recorded attachment, then drop its record (the pins go with it).

        The plugin's own work (pod interfaces, the host's addresses, routes, rules) is undone first
        and whatever IPAM does. IPAM is released after it: a failure there is raised once the record
        has been cut down to what the IPAM retry needs (no bonds: nothing stays pinned), so the next
        DEL retries only that. If the host could not be given back, the whole record stays.
        A bond re-addressed meanwhile keeps its present addresses; that is noted for state/doctor.
        ``locked``: the caller holds the node lock (record writes need it).
        """
        own: CniError | None = None
        try:
            skipped = tx.teardown(rec, host, netns_path, fp,
                                  detach=lambda b, ns: macvlan_rdma.detach(cfg, rec, b, ns))
        except CniError as exc:
            own, skipped = exc, []
        if own is None:
            _note_deadlines(state, host, rec, {b.bond for b, _ in skipped})
        for b, drift in skipped:
            state.note_skipped(SkippedRestore(
                bond=b.bond, container_id=rec.container_id, ifname=rec.ifname,
                recorded=list(drift.recorded), current=list(drift.current), routes=len(b.routes),
                rules=len(b.rules)))
        ipam = self._ipam_release(req, rec)
        if own is not None:
            raise own
        if ipam is None:
            state.remove(rec.container_id, rec.ifname)
            return
        pending = AttachmentRecord(
            container_id=rec.container_id, ifname=rec.ifname, netns=rec.netns, netns_inode=rec.netns_inode,
            phase=PHASE_IPAM_PENDING, cni_version=rec.cni_version, network=rec.network, ipam=rec.ipam,
        )
        if locked:
            state.replace(pending)
        else:
            with state.locked():
                state.replace(pending)
        raise ipam

    def _ipam_release(self, req: Request, rec: AttachmentRecord) -> CniError | None:
        """IPAM DEL for a recorded attachment: None when released (or nothing to release), else
        the error to report. A type that can never run (a path, not a plain name) is skipped:
        retrying could never succeed and would keep the pod from ever being deleted."""
        if rec.ipam is None:
            return None
        kind = rec.ipam.get("type")
        if not invoke.is_plain_name(kind):
            log.error("%s %s/%s: IPAM type %r is not a plain executable name, so it can never run: "
                      "its DEL is skipped", req.command, rec.container_id, rec.ifname, kind)
            return None
        try:
            self._ipam_del(req, rec)
        except (CniError, OSError) as exc:
            code = exc.code if isinstance(exc, CniError) else IO_FAILURE
            why = exc.msg if isinstance(exc, CniError) else str(exc)
            log.error("%s %s/%s: IPAM %s DEL failed: %s", req.command, rec.container_id, rec.ifname, kind,
                      why)
            return CniError(
                code,
                f"the host is restored, but IPAM plugin {kind!r} DEL failed: {why} "
                "(a repeated DEL retries only the IPAM release)",
            )
        return None

    def _ipam_del(self, req: Request, rec: AttachmentRecord) -> None:
        assert rec.ipam is not None
        env = dict(req.env)
        env.update({"CNI_CONTAINERID": rec.container_id, "CNI_IFNAME": rec.ifname, "CNI_NETNS": rec.netns})
        conf = {"cniVersion": rec.cni_version or req.cni_version, "name": rec.network or req.name,
                "ipam": rec.ipam}
        path = invoke.find_plugin(str(rec.ipam["type"]), req.path)
        invoke.exec_plugin(path, "DEL", env, conf)

    def _reclaim_dead(self, req: Request, cfg: MacvlanConfig, state: NodeState, host: Any) -> None:
        """A bond pinned to a container whose netns is gone is given back before choosing bonds
        (unless that attachment's ADD or DEL is in flight: its claim is busy; it is skipped)."""
        for rec in state.attachments():
            if not rec.bonds:  # ipam-pending: pins nothing; its IPAM retry (maybe slow) is DEL's/GC's
                continue
            if rec.key == req.attachment or netns_inode(rec.netns) == rec.netns_inode:
                continue
            with state.try_claim(rec.key) as free:
                if not free:
                    log.info("not reclaiming %s/%s now: a call for it is in flight", rec.container_id,
                             rec.ifname)
                    continue
                log.warning("reclaiming bonds %s of %s/%s: its netns %s is gone",
                            [b.bond for b in rec.bonds], rec.container_id, rec.ifname, rec.netns)
                try:
                    self._forget(req, cfg, state, rec, host, "", locked=True)
                except CniError as exc:
                    log.error("could not reclaim %s/%s: %s", rec.container_id, rec.ifname, exc.msg)

    def _result(self, req: Request, rec: AttachmentRecord) -> Result:
        res = Result()
        for i, b in enumerate(rec.bonds):
            res.interfaces.append(Interface(name=b.pod_ifname, mac=b.mac, mtu=b.mtu, sandbox=req.netns))
            for a in b.addresses:
                cidr = f"{addresses.ip_of(a)}/{a['prefixlen']}"
                res.ips.append(IPConfig(cidr, tx.result_gateway(b, a), i))
            for r in b.pod_routes:
                subnet = not attr(r, "RTA_GATEWAY") and attr(r, "RTA_TABLE") == routes.RT_TABLE_MAIN
                if not subnet or r["dst_len"] == 0:
                    res.routes.append(_route_of(r))
        if rec.ipam_result:
            ipam = parse_result(rec.ipam_result, "IPAM result")
            for ip in ipam.ips:
                idx = ip.interface if ip.interface is not None and ip.interface < len(rec.bonds) else 0
                res.ips.append(IPConfig(ip.address, ip.gateway, idx))
            res.routes.extend(ipam.routes)
            res.dns = ipam.dns
        return res

    # ---------------------------------------------------------------- DEL
    def delete(self, req: Request) -> None:
        cfg = _cleanup_config(req)
        fp = tx.Failpoints(req.env)
        state = NodeState(cfg.data_dir)
        # The claim alone: the record pins its bonds until it is removed, after they are given back.
        with state.claimed(req.attachment):
            fp.hit("del-locked")
            rec = state.get(req.container_id, req.ifname)
            if rec is None:
                log.info("DEL %s/%s: nothing recorded", req.container_id, req.ifname)
                state.sweep()  # an ADD killed while writing its write-ahead record left a temp file
                unrecorded = AttachmentRecord(req.container_id, req.ifname, req.netns, 0, ipam=cfg.ipam)
                err = self._ipam_release(req, unrecorded)
                if err is not None:
                    raise err
                return
            host = netlink_in(None)
            try:
                try:
                    self._forget(req, cfg, state, rec, host, req.netns, fp)
                finally:  # host.json has a lock of its own: no node lock for this (nor for DEL)
                    macvlan_rdma.refresh_host_record(cfg, host)
            finally:
                host.close()

    # ---------------------------------------------------------------- CHECK
    def check(self, req: Request) -> None:
        cfg = _config(req)
        state = NodeState(cfg.data_dir)
        rec = state.get(req.container_id, req.ifname)
        if rec is None or rec.phase != PHASE_ADDED:
            raise CniError(CHECK_FAILED, f"no completed ADD is recorded for {req.container_id}/{req.ifname}")
        pins = state.pins()
        for b in rec.bonds:
            if pins.get(b.bond) != rec.key:
                raise CniError(CHECK_FAILED, f"{b.bond} is no longer pinned to this container")
        ns = open_netns(req.netns)
        with ns:
            if ns.inode != rec.netns_inode:
                raise CniError(CHECK_FAILED, f"{req.netns} is not the netns recorded at ADD")
            host = netlink_in(None)
            pod = netlink_in(ns)
            try:
                for b in rec.bonds:
                    _check_bond(host, pod, b, chained=req.prev_result is not None)
                _check_prev_result(req, pod)
            finally:
                pod.close()
                host.close()

    # ---------------------------------------------------------------- GC
    def gc(self, req: Request) -> None:
        cfg = _cleanup_config(req)
        if req.valid_attachments is None:
            raise CniError(INVALID_CONFIG, "GC needs 'cni.dev/valid-attachments' (the runtime's live list)")
        valid = set(req.valid_attachments)
        state = NodeState(cfg.data_dir)
        failures: list[str] = []
        first_code = NETLINK_FAILURE
        fp = tx.Failpoints(req.env)
        with state.locked():
            fp.hit("del-locked")
            host = netlink_in(None)
            try:
                for rec in state.attachments():
                    if rec.key in valid:
                        continue
                    with state.try_claim(rec.key) as free:
                        if not free:  # its ADD is still running (the runtime may not list it yet)
                            log.info("GC: %s/%s is in flight: left for its own DEL or the next GC",
                                     rec.container_id, rec.ifname)
                            continue
                        log.info("GC: %s/%s is not in the valid list", rec.container_id, rec.ifname)
                        try:
                            self._forget(req, cfg, state, rec, host, "", fp, locked=True)
                        except CniError as exc:
                            first_code = exc.code if not failures else first_code
                            failures.append(f"{rec.container_id}/{rec.ifname}: {exc.msg}")
                macvlan_rdma.refresh_host_record(cfg, host)
            finally:
                host.close()
        if failures:
            # The first failure's code: an IPAM that answered 11 makes GC's answer 11 too.
            raise CniError(first_code, "GC could not clean up: " + "; ".join(failures))

    # ---------------------------------------------------------------- STATUS
    def status(self, req: Request) -> None:
        # Only the keys STATUS reads: it may be asked every few seconds.
        cfg = parse_status_config(node_policy.load(req.env).narrow(req.config, PLUGIN), DEFAULT_DATA_DIR)
        logconf.configure(cfg.log_file, cfg.log_level)
        state = NodeState(cfg.data_dir)
        try:
            state.ensure()
            if not os.access(cfg.data_dir, os.W_OK):
                raise OSError(f"{cfg.data_dir} is not writable")
        except OSError as exc:
            raise CniError(STATUS_UNAVAILABLE, f"state dir unusable: {exc}") from exc
        try:
            masters = self._masters(cfg)
            if any(macvlan_rdma.device_of(cfg.sysfs_root, m) for m in masters):
                require_mode(cfg.sysfs_root, cfg.rdma.netns_mode)
        except CniError as exc:
            raise CniError(STATUS_UNAVAILABLE, exc.msg, exc.details) from exc
        pins = state.pins()
        host = netlink_in(None)
        try:
            # ADD's own check of the configured masters, answered with ADD's error (7, naming 'masters',
            # the entry and the fix), not 50: the CNI 1.1 spec has STATUS fail when the plugin knows ADD
            # cannot succeed and defines 50/51 for that context, but does not confine STATUS to them,
            # and 7 (invalid network config) is a well-known code for every verb. A config ADD refuses
            # is no "not ready yet": the same words from both verbs name the one fix.
            known = _configured_masters(host, cfg.masters) if cfg.masters else {}
            reasons = []
            for m in masters:
                link = known[m] if m in known else links.get_link(host, m)
                if m in pins:
                    reasons.append(f"{m} pinned to {pins[m].container_id}")
                elif link is None:
                    reasons.append(f"{m} does not exist")
                elif cfg.ipam is None and not addresses.holds_movable(host, link.index):
                    reasons.append(f"{m} holds no IP address")
                else:
                    return
        finally:
            host.close()
        raise CniError(STATUS_UNAVAILABLE, "no bond can be handed out now: " + "; ".join(reasons)
                       + f" ({describe_pins(pins)})")


def _note_deadlines(state: NodeState, host: Any, rec: AttachmentRecord, skipped: set[str]) -> None:
    """After a give-back: the deadlines of the finite lifetimes put back, for the bond's next ADD."""
    for b in rec.bonds:
        if not b.moves_addresses or b.bond in skipped or not addresses.has_deadlines(b.addresses):
            continue
        try:
            link = links.get_link(host, b.bond)
            if link is not None:
                state.note_deadlines(b.bond, addresses.deadline_notes(host, link.index, b.addresses))
        except Exception as exc:  # noqa: BLE001 - advisory: the next ADD reads the kernel's deadlines
            log.warning("%s: noting its addresses' deadlines failed: %s", b.bond, exc)


def _configured_masters(host: Any, masters: list[str]) -> dict[str, links.Link]:
    """Every bond the config names, looked up once: one that does not exist or cannot carry a
    macvlan is a config error (7, naming it), never "no free bond, try again" (11)."""
    found = {}
    for name in dict.fromkeys(masters):
        found[name] = links.master_link(host, name)
    return found


def _ipam_ipv4(ctx: tx.AddContext, i: int) -> str | None:
    """The IPAM-assigned IPv4 of bond ``i`` (None: the bond's own, moved address counts)."""
    return next((ip for ip, _ in ctx.extra_ips.get(i, []) if ":" not in ip), None)


_MAC_RE = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")


def _requested_mac(req: Request) -> str:
    """The pod's MAC from ``runtimeConfig.mac`` (7 when bad) or ``CNI_ARGS`` ``MAC=`` (4 when bad):
    checked before anything is changed, since the kernel's refusal would come mid-transaction."""
    if req.runtime_config.get("mac") not in (None, ""):
        mac, where, code = req.runtime_config["mac"], "runtimeConfig.mac", INVALID_CONFIG
    else:
        mac, where, code = req.args.get("MAC", ""), "CNI_ARGS MAC", INVALID_ENV
    if mac == "":
        return ""
    if not isinstance(mac, str) or not _MAC_RE.fullmatch(mac) or int(mac[:2], 16) & 1:
        raise CniError(code, f"{where} is {mac!r}: it must be a unicast MAC like 02:00:00:00:00:01")
    return mac


def _route_of(r: dict[str, Any]) -> Route:
    dst = attr(r, "RTA_DST") or ("0.0.0.0" if r["family"] == 2 else "::")
    table = attr(r, "RTA_TABLE", r["table"])
    return Route(dst=f"{dst}/{r['dst_len']}", gw=attr(r, "RTA_GATEWAY") or "",
                 priority=attr(r, "RTA_PRIORITY") or 0,
                 table=None if table == routes.RT_TABLE_MAIN else table)


def _check_bond(host: Any, pod: Any, b: BondRecord, chained: bool) -> None:
    """Compare one pod interface with what ADD recorded.

    In a chain, a later plugin (tuning) may legitimately change MAC or MTU; the chain's final result
    (prevResult) is then the authority for the MAC and the MTU (checked in ``_check_prev_result``),
    so the recorded values are compared only when CHECK comes without a prevResult.
    """
    link = links.get_link(pod, b.pod_ifname)
    if link is None or link.kind != "macvlan":
        raise CniError(CHECK_FAILED, f"pod interface {b.pod_ifname} is missing")
    if not chained and b.mac and link.mac != b.mac:
        raise CniError(CHECK_FAILED, f"{b.pod_ifname} MAC is {link.mac}, recorded {b.mac}")
    if not chained and link.mtu != b.mtu:
        raise CniError(CHECK_FAILED, f"{b.pod_ifname} MTU is {link.mtu}, recorded {b.mtu}")
    if not link.up:
        raise CniError(CHECK_FAILED, f"{b.pod_ifname} is down")
    live = set(addresses.live_cidrs(pod, link.index))
    for a in b.addresses:
        if addresses.cidr(a) not in live:
            raise CniError(CHECK_FAILED, f"{addresses.cidr(a)} is missing from {b.pod_ifname}")
    bond = links.get_link(host, b.bond)
    if bond is not None:
        on_bond = set(addresses.live_cidrs(host, bond.index))
        for a in b.addresses:
            if addresses.cidr(a) in on_bond:
                raise CniError(CHECK_FAILED, f"{addresses.cidr(a)} is back on {b.bond} on the host")
    have = {routes.route_key(r) for r in routes.live_routes(pod, link.index)}
    for r in b.pod_routes:
        if routes.route_key(r) not in have:
            raise CniError(CHECK_FAILED, f"route {routes.describe_route(r)} is missing in the pod")
    rules = pod_routing.live_rule_keys(pod, [r["family"] for r in b.pod_rules])
    for r in b.pod_rules:
        if pod_routing.rule_key(r) not in rules:
            raise CniError(CHECK_FAILED, f"rule from {attr(r, 'FRA_SRC')} lookup {attr(r, 'FRA_TABLE')} "
                           "is missing in the pod")


def _check_prev_result(req: Request, pod: Any) -> None:
    prev = req.prev_result
    if prev is None:
        return
    for i, iface in enumerate(prev.interfaces):
        if iface.sandbox != req.netns:
            continue
        link = links.get_link(pod, iface.name)
        if link is None:
            raise CniError(CHECK_FAILED, f"prevResult interface {iface.name} is missing")
        if iface.mac and iface.mac.lower() != link.mac.lower():
            raise CniError(
                CHECK_FAILED, f"{iface.name} MAC is {link.mac}, the chain's result says {iface.mac}"
            )
        if iface.mtu and iface.mtu != link.mtu:
            raise CniError(
                CHECK_FAILED, f"{iface.name} MTU is {link.mtu}, the chain's result says {iface.mtu}"
            )
        live = set(addresses.live_cidrs(pod, link.index))
        for ip in prev.ips:
            if ip.interface == i and str(ipaddress.ip_interface(ip.address)) not in live:
                raise CniError(CHECK_FAILED, f"prevResult address {ip.address} missing on {iface.name}")
