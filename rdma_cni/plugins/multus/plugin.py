"""rdma-multus: one CNI config that runs the pod's networks, chosen by a pod annotation.

ADD reads like the data path: config → pod's network request (runtime annotations or the API) →
plan (delegate configs, interface names, device IDs) → write the plan → run delegates in order,
undoing the ones already added if one fails → the default network's result plus the others'
interfaces. DEL, CHECK and GC replay the plan; none of them needs the API server.

The default network (first of ``defaultDelegates``) always gets ``CNI_IFNAME``; the pod's annotation
may name it too (the TKE form ``tke-route-eni,tke-rdma-macvlan``) or leave it out (the Multus form,
extra networks only). Every other network gets ``net1``, ``net2``… unless it names its interface.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rdma_cni import log as rdma_log
from rdma_cni import node_policy
from rdma_cni.cni import conflist
from rdma_cni.cni.cache import ResultCache
from rdma_cni.cni.errors import (
    CHECK_FAILED,
    INVALID_CONFIG,
    IO_FAILURE,
    STATE_CORRUPT,
    STATUS_UNAVAILABLE,
    CniError,
)
from rdma_cni.cni.invoke import find_plugin
from rdma_cni.cni.request import Attachment, Request
from rdma_cni.cni.result import Result
from rdma_cni.cni.result import parse as parse_result
from rdma_cni.devices.dra_names import DRIVER
from rdma_cni.plugins.multus import claims
from rdma_cni.plugins.multus import status as multus_status
from rdma_cni.plugins.multus.config import MultusConfig, parse_cleanup_config, parse_config
from rdma_cni.plugins.multus.delegates import Delegate, DelegateRunner, gc_network, status_network
from rdma_cni.plugins.multus.nad import load_network
from rdma_cni.plugins.multus.networks import NetworkSelection
from rdma_cni.plugins.multus.plan import AttachmentPlan, PlanStore
from rdma_cni.plugins.multus.pod import CRI_ANNOTATIONS, PodView

if TYPE_CHECKING:
    from rdma_cni.kube.podresources import ClaimDevice

log = logging.getLogger("rdma_cni.multus")


class Multus:
    def add(self, req: Request) -> Result:
        cfg, policy = _add_config(req)
        store = PlanStore(cfg.cache_dir)
        earlier = store.load(req.container_id, req.ifname)
        if earlier is not None:
            _undo_earlier(req, cfg, store, earlier)
        pod = PodView(req, cfg)
        wanted = _networks(req, cfg, pod.selections())
        plan = AttachmentPlan(
            req.container_id, req.ifname, req.netns, pod.ref(), _plan(req, cfg, pod, wanted, policy)
        )
        store.save(plan)  # before any delegate runs: DEL must be able to undo a half-done ADD
        runner = _runner(req, cfg)
        results: list[dict[str, Any]] = []
        for index, delegate in enumerate(plan.delegates):
            try:
                results.append(runner.add(delegate))
            except (CniError, OSError) as exc:
                err = _as_cni_error(exc)
                log.error(
                    "ADD of network %s (%s) failed: %s; undoing", delegate.network, delegate.ifname, err.msg
                )
                _rollback(store, runner, plan, index)
                msg = f"network {delegate.network} ({delegate.ifname}): {err.msg}"
                raise CniError(err.code, msg, err.details) from exc
        _write_network_status(req, cfg, pod, plan.delegates, wanted, results)
        return _merge(plan.delegates, results)

    def delete(self, req: Request) -> None:
        cfg = _cleanup_config(req)
        store = PlanStore(cfg.cache_dir)
        try:
            plan = store.load(req.container_id, req.ifname)
        except CniError as err:
            if err.code != STATE_CORRUPT:
                raise
            log.error("DEL %s %s: %s; recovering from the delegates' result caches", req.container_id,
                      req.ifname, err.msg)  # fmt: skip
            plan = _recover_plan(req, cfg)
        if plan is None:
            log.info(
                "DEL %s %s: nothing recorded (never added or already deleted)", req.container_id, req.ifname
            )
            return
        failed = _undo(_runner(req, cfg), plan.delegates)
        # After the delegates, not before as Multus did: the bonds are back on the host before the
        # API server is asked anything, and a runtime that kills a slow DEL kills only this call.
        _clear_network_status(req, cfg, plan)
        if failed:
            # Keep only what failed: the runtime retries DEL, and it retries just those.
            plan.delegates = [d for d, _ in failed][::-1]
            store.save(plan)
            raise failed[0][1]
        store.remove(req.container_id, req.ifname)

    def check(self, req: Request) -> None:
        cfg = _config(req)
        plan = PlanStore(cfg.cache_dir).load(req.container_id, req.ifname)
        if plan is None:
            raise CniError(CHECK_FAILED, f"rdma-multus has no record of {req.container_id} {req.ifname}")
        runner = _runner(req, cfg)
        for delegate in plan.delegates:
            runner.check(delegate)

    def gc(self, req: Request) -> None:
        cfg = _cleanup_config(req)
        if req.valid_attachments is None:
            log.info("GC without cni.dev/valid-attachments: nothing is known to be stale")
            return
        valid = set(req.valid_attachments)
        store = PlanStore(cfg.cache_dir)
        live: list[AttachmentPlan] = []
        for plan in store.plans():
            if Attachment(plan.container_id, plan.ifname) in valid:
                live.append(plan)
                continue
            log.info("GC: removing stale attachment %s %s (pod %s)", plan.container_id, plan.ifname, plan.pod)
            netns = plan.netns if plan.netns and os.path.exists(plan.netns) else ""
            runner = _runner(req, cfg, plan.container_id, netns)
            failed = _undo(runner, plan.delegates)
            if failed:
                plan.delegates = [d for d, _ in failed][::-1]
                store.save(plan)
            else:
                store.remove(plan.container_id, plan.ifname)
        _forward_gc(req, cfg, live)

    def status(self, req: Request) -> None:
        cfg = _config(req)
        dirs = cfg.delegate_dirs(req.path)
        for name in cfg.default_delegates:
            try:
                net = conflist.load(cfg.conf_dir, name)
            except CniError as err:
                raise CniError(STATUS_UNAVAILABLE, f"default network {name}: {err.msg}") from err
            status_network(net, dirs, req.env, cfg.delegate_timeout)


PLUGIN = "rdma-multus"


def _config(req: Request) -> MultusConfig:
    return _add_config(req)[0]


def _add_config(req: Request) -> tuple[MultusConfig, node_policy.NodePolicy]:
    """ADD/CHECK/STATUS: read through the node's policy (a NAD may name rdma-multus too, and its
    kubeconfig, confDir, binDirs and cacheDir are the node's to choose: :mod:`rdma_cni.node_policy`);
    ADD keeps the policy for the NADs it reads."""
    policy = node_policy.load(req.env)
    cfg = parse_config(policy.narrow(req.config, PLUGIN))
    rdma_log.configure(cfg.log_file, cfg.log_level)
    return cfg, policy


def _cleanup_config(req: Request) -> MultusConfig:
    """DEL/GC: a config problem must not keep the pod's networks from being deleted."""
    cfg, problems = parse_cleanup_config(node_policy.load(req.env).narrow(req.config, PLUGIN, cleanup=True))
    rdma_log.configure(cfg.log_file, cfg.log_level)
    for problem in problems:
        log.warning(
            "%s %s %s: %s; using its default to clean up", req.command, req.container_id, req.ifname, problem
        )
    return cfg


def _undo_earlier(req: Request, cfg: MultusConfig, store: PlanStore, plan: AttachmentPlan) -> None:
    """An ADD for an attachment that has a plan (a failed ADD whose DEL never came, or a repeated
    ADD) first deletes what that plan ran, by DEL's rules; what will not delete stays in the plan
    and fails this ADD with that delegate's error."""
    log.warning("ADD %s %s: an earlier attempt is recorded; undoing it first", req.container_id, req.ifname)
    netns = plan.netns if plan.netns and os.path.exists(plan.netns) else ""
    failed = _undo(_runner(req, cfg, netns=netns), plan.delegates)
    if not failed:
        store.remove(req.container_id, req.ifname)
        return
    plan.delegates = [d for d, _ in failed][::-1]
    store.save(plan)
    err = failed[0][1]
    raise CniError(
        err.code, f"undoing the earlier ADD of {req.container_id} {req.ifname}: {err.msg}", err.details
    )


def _recover_plan(req: Request, cfg: MultusConfig) -> AttachmentPlan:
    """A plan rebuilt from the libcni result caches of the delegates that finished ADD.

    Only reached when the plan file itself is unreadable (atomic writes make that a disk fault):
    each cache entry holds the network's config, interface name and arguments, which is what DEL
    needs. A delegate that never finished ADD has no entry; its own DEL semantics cover it.
    """
    entries = list(ResultCache(cfg.cache_dir).entries(container_id=req.container_id))
    delegates = [
        Delegate(
            network=e.network,
            ifname=e.ifname,
            config=e.config,
            is_default=e.ifname == req.ifname,
            cni_args=list(e.cni_args),
            capability_args=dict(e.capability_args),
        )
        for e in entries
    ]
    delegates.sort(key=lambda d: not d.is_default)  # undone last-first: the default network goes last
    return AttachmentPlan(req.container_id, req.ifname, req.netns, {}, delegates)


def _runner(
    req: Request, cfg: MultusConfig, container_id: str = "", netns: str | None = None
) -> DelegateRunner:
    return DelegateRunner(
        bin_dirs=cfg.delegate_dirs(req.path),
        cache=ResultCache(cfg.cache_dir),
        container_id=container_id or req.container_id,
        netns=req.netns if netns is None else netns,
        base_env=req.env,
        timeout=cfg.delegate_timeout,
    )


def _rollback(store: PlanStore, runner: DelegateRunner, plan: AttachmentPlan, failed: int) -> None:
    """Undo a failed ADD: DEL the failed delegate and every one added before it, last-first.

    The failed delegate's own DEL may fail too (its config may be what is broken); that must not
    pin the pod forever. A delegate that had been added and will not DEL stays in the plan, so the
    DEL the runtime sends after a failed ADD tries it again.
    """
    _undo(runner, [plan.delegates[failed]])
    stuck = [d for d in reversed(plan.delegates[:failed]) if _undo(runner, [d])][::-1]
    if stuck:
        plan.delegates = stuck
        store.save(plan)
    else:
        store.remove(plan.container_id, plan.ifname)


def _undo(runner: DelegateRunner, delegates: Sequence[Delegate]) -> list[tuple[Delegate, CniError]]:
    """DEL ``delegates`` last-first; every one is tried, those that failed are returned (in the
    order they were tried) with their error."""
    failed: list[tuple[Delegate, CniError]] = []
    for delegate in reversed(delegates):
        try:
            runner.delete(delegate)
        except (CniError, OSError) as exc:
            err = _as_cni_error(exc)
            log.error("DEL of network %s (%s) failed: %s", delegate.network, delegate.ifname, err.msg)
            failed.append(
                (delegate, CniError(err.code, f"network {delegate.network} ({delegate.ifname}): {err.msg}"))
            )
    return failed


def _as_cni_error(exc: BaseException) -> CniError:
    if isinstance(exc, CniError):
        return exc
    return CniError(IO_FAILURE, f"{type(exc).__name__}: {exc}")


def _merge(delegates: Sequence[Delegate], results: Sequence[dict[str, Any]]) -> Result:
    parsed = [
        parse_result(r, what=f"result of network {d.network}")
        for d, r in zip(delegates, results, strict=True)
    ]
    default_index = next(i for i, d in enumerate(delegates) if d.is_default)
    merged = parsed[default_index]
    for i, other in enumerate(parsed):
        if i != default_index:
            merged.merge(other)
    return merged


@dataclass(frozen=True)
class _Wanted:
    """A network the pod asks for, and the interface name it gets."""

    selection: NetworkSelection
    ifname: str
    is_default: bool


def _plan(
    req: Request, cfg: MultusConfig, pod: PodView, wanted: Sequence[_Wanted], policy: node_policy.NodePolicy
) -> list[Delegate]:
    dirs = cfg.delegate_dirs(req.path)
    delegates = []
    claimed = False
    bounds = policy.networks if policy.enforced else None
    for w in wanted:
        net = load_network(cfg, w.selection, pod, bounds)
        for plugin in net.plugins:
            # Fail before anything runs when a binary is missing: a rollback is never free.
            find_plugin(str(plugin["type"]), dirs)
        located = _resource_plugin(net)
        claimed = claimed or (located is not None and located[1] == cfg.rdma_resource)
        delegates.append(_delegate(req, net, w, pod))
        if any(p.get("type") == SHARED_PLUGIN for p in net.plugins):
            _check_shared_devices(cfg, pod, net.name, located[1] if located else cfg.rdma_resource)
    if not claimed:
        _check_unclaimed_devices(cfg, pod)
    return delegates


SHARED_PLUGIN = "rdma-ipvlan"  # shared mode: every pod a child of every bond, the shared pool's devices
SHARED_NETWORK = "tke-rdma-ipvlan"
EXCLUSIVE_NETWORK = "tke-rdma-macvlan"


def _check_shared_devices(cfg: MultusConfig, pod: PodView, network: str, resource: str) -> None:
    """A shared-mode network without the shared pool's devices still gets its interfaces (they
    carry TCP fine), but the pod sees no RDMA device: a WARN, judged from the checkpoints only
    (kubelet's answer when it was already asked), a DRA claim of our driver counting as devices."""
    if not pod.annotation_read or pod.checkpoint_devices().get(resource) or pod.checkpoint_claim_devices():
        return
    log.warning(
        "pod %s/%s names network %s but holds no %s device: it gets its interfaces, but will see no "
        "RDMA device (request the resource %s in the pod spec, or a DRA claim of %s)",
        pod.namespace, pod.name, network, resource, resource, DRIVER,
    )  # fmt: skip


def _rdma_network_hint(cfg: MultusConfig) -> str:
    """The RDMA network this node's delegate configs offer: shared mode's when its config is there."""
    for name in (SHARED_NETWORK, EXCLUSIVE_NETWORK):
        files = (os.path.join(cfg.conf_dir, name + ext) for ext in (".conf", ".conflist", ".json"))
        if any(os.path.exists(f) for f in files):
            return name
    return EXCLUSIVE_NETWORK


def _check_unclaimed_devices(cfg: MultusConfig, pod: PodView) -> None:
    """A pod that holds RDMA devices but gets no network using them would start without RDMA.

    When its annotation could not be read at all (no kubeconfig, and the runtime passed none), that
    is a node misconfiguration a retry cannot fix: the ADD fails naming both fixes. When the
    annotation was read and simply names no RDMA network, the pod may mean it: a WARN (also shown by
    ``cni-tool doctor``/``state``), judged from the checkpoint only so that pods without RDMA
    networks never pay for a gRPC call.
    """
    who = f"pod {pod.namespace}/{pod.name}"
    if not pod.annotation_read:
        ids = pod.devices().get(cfg.rdma_resource, []) + _claim_labels(pod.claim_devices())
        if ids:
            raise CniError(
                INVALID_CONFIG,
                f"{who} holds {len(ids)} {cfg.rdma_resource} device(s) ({', '.join(ids)}) but rdma-multus "
                f"cannot read its {cfg.annotation} annotation, so it would start without RDMA networks: "
                f'set "kubeconfig" in the rdma-multus config, or let the runtime pass the annotations '
                f'(containerd: "capabilities": {{"{CRI_ANNOTATIONS}": true}} in rdma-multus\'s conflist)',
            )
        return
    ids = pod.checkpoint_devices().get(cfg.rdma_resource, []) + _claim_labels(pod.checkpoint_claim_devices())
    if ids:
        log.warning(
            "%s holds %d %s device(s) (%s) but its %s annotation names no network using them: it starts "
            "without RDMA interfaces (add the RDMA network, e.g. %s, to the annotation)",
            who, len(ids), cfg.rdma_resource, ", ".join(ids), cfg.annotation, _rdma_network_hint(cfg),
        )  # fmt: skip


def _claim_labels(found: Sequence[ClaimDevice]) -> list[str]:
    """Our driver's DRA devices as the unclaimed-devices messages name them."""
    return [f"{c.device} (DRA claim {c.claim_namespace}/{c.claim_name})" for c in found]


def _write_network_status(
    req: Request,
    cfg: MultusConfig,
    pod: PodView,
    delegates: Sequence[Delegate],
    wanted: Sequence[_Wanted],
    results: Sequence[dict[str, Any]],
) -> None:
    """Publish Multus's ``network-status`` annotation for the networks just added (best effort).

    Only with a kubeconfig, as Multus: without one there is no identity to write with. Names follow
    Multus: the default network by its config name, the others as ``namespace/name``.
    """
    if not cfg.kubeconfig or not pod.name or not pod.namespace:
        log.debug("network-status not written: no kubeconfig or no pod name in CNI_ARGS")
        return
    entries: list[dict[str, Any]] = []
    for d, w, raw in zip(delegates, wanted, results, strict=True):
        name = d.network if w.is_default else f"{w.selection.namespace or pod.namespace}/{w.selection.name}"
        result = parse_result(raw, what=f"result of network {d.network}")
        info = multus_status.rdma_device_info(d.config, req.container_id)
        entries.extend(multus_status.network_statuses(name, result, w.is_default, info))
    text = multus_status.render(entries)

    def patch(annotations: dict[str, str]) -> None:
        pod.api().patch_pod_annotations(pod.namespace, pod.name, annotations)

    multus_status.publish(patch, text, f"{pod.namespace}/{pod.name}", cfg.cache_dir)


DEL_API_TIMEOUT = 0.5  # seconds, one attempt: what the API server may add to a DEL at most


def _clear_network_status(req: Request, cfg: MultusConfig, plan: AttachmentPlan) -> None:
    """Set the pod's ``network-status`` to ``[]`` on DEL (best effort), as Multus's DEL did.

    Multus's conditions: a kubeconfig, and the netns still there (a DEL without it is the runtime's
    cleanup of a sandbox already torn down, or a repeat). Not Multus's: its skip of the system
    namespaces, as ADD writes there too. The pod is the one the runtime names, else the one the
    plan recorded; its UID keeps the PATCH off a new pod of the same name. One attempt within
    :data:`DEL_API_TIMEOUT`: the API server being down must not hold the pod's deletion.
    """
    if not cfg.kubeconfig:
        return
    ref = {
        k: req.args.get(f"K8S_POD_{k.upper()}", "") or plan.pod.get(k, "")
        for k in ("namespace", "name", "uid")
    }
    who = f"{ref['namespace']}/{ref['name']}"
    if not ref["namespace"] or not ref["name"]:
        log.debug("%s not cleared: no pod name in CNI_ARGS or the plan", multus_status.ANNOTATION)
        return
    if not req.netns or not os.path.exists(req.netns):
        log.debug("pod %s: %s not cleared: netns %r is gone", who, multus_status.ANNOTATION, req.netns)
        return

    def patch(annotations: dict[str, str]) -> bool:
        # Here, not at the top: the API client and the kubeconfig reader cost ~80 ms of a cold
        # call (python -X importtime, see PodView.api), which a DEL without a kubeconfig never pays.
        from rdma_cni.kube import kubeconfig
        from rdma_cni.kube.client import PodClient

        timeout = min(cfg.api_timeout, DEL_API_TIMEOUT)
        api = PodClient(kubeconfig.load(cfg.kubeconfig), timeout=timeout, attempts=1)
        return api.patch_pod_annotations_of(ref["namespace"], ref["name"], ref["uid"], annotations)

    multus_status.clear(patch, who, cfg.cache_dir)


def _networks(req: Request, cfg: MultusConfig, selections: list[NetworkSelection]) -> list[_Wanted]:
    by_name = {s.name: s for s in selections}
    ordered = [by_name.get(n, NetworkSelection(name=n)) for n in cfg.default_delegates]
    ordered += [s for s in selections if s.name not in cfg.default_delegates]
    first = ordered[0]
    if first.interface and first.interface != req.ifname:
        raise CniError(
            INVALID_CONFIG,
            f"pod annotation {cfg.annotation}: {first.name} is the default network and always gets "
            f"CNI_IFNAME ({req.ifname}); remove '@{first.interface}'",
        )
    taken = {req.ifname} | {s.interface for s in ordered[1:] if s.interface}
    if any(s.interface == req.ifname for s in ordered[1:]):
        raise CniError(
            INVALID_CONFIG,
            f"pod annotation {cfg.annotation}: {req.ifname} is the default network's interface",
        )
    out = [_Wanted(first, req.ifname, True)]
    counter = 0
    for sel in ordered[1:]:
        ifname = sel.interface
        while not ifname:
            counter += 1
            candidate = f"net{counter}"
            if candidate not in taken:
                ifname = candidate
                taken.add(candidate)
        out.append(_Wanted(sel, ifname, False))
    names = [w.selection.name for w in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        log.info("networks requested more than once: %s", dupes)
    return out


def _delegate(req: Request, net: conflist.NetworkConfigList, w: _Wanted, pod: PodView) -> Delegate:
    sel = w.selection
    cni_args: list[tuple[str, str]] = [("IgnoreUnknown", "1")]
    cni_args += [(k, v) for k, v in req.args.items() if k != "IgnoreUnknown"]
    capability_args: dict[str, Any] = dict(req.runtime_config) if w.is_default else {}
    if sel.mac:
        capability_args["mac"] = sel.mac
        cni_args.append(("MAC", sel.mac))
    if sel.ips:
        capability_args["ips"] = list(sel.ips)
        cni_args.append(("IP", ",".join(sel.ips)))
    injected: dict[int, dict[str, Any]] = {}
    runtime_injected: dict[int, dict[str, Any]] = {}
    if sel.cni_args:
        for i, plugin in enumerate(net.plugins):
            args = dict(plugin.get("args") or {})
            args["cni"] = {**(args.get("cni") or {}), **sel.cni_args}
            injected[i] = {"args": args}
    _inject_devices(net, sel, pod, injected, runtime_injected)
    return Delegate(
        network=net.name,
        ifname=w.ifname,
        config=net.raw,
        is_default=w.is_default,
        cni_args=cni_args,
        capability_args=capability_args,
        injected=injected,
        runtime_injected=runtime_injected,
    )


def _inject_devices(
    net: conflist.NetworkConfigList,
    sel: NetworkSelection,
    pod: PodView,
    injected: dict[int, dict[str, Any]],
    runtime_injected: dict[int, dict[str, Any]],
) -> None:
    """Give the network's resource-naming plugin the pod's devices, the way Multus does.

    Multus sets a top-level ``deviceID``; rdma-macvlan also reads ``runtimeConfig.deviceIDs`` (all of
    them: a pod with four RDMA NICs gets four bonds) and ``count`` (when the kubelet's checkpoint has
    no entry, the pod's requested count still says how many). The bonds of the pod's DRA claims
    join the devices of the node's RDMA resource (``rdmaResourceName``), as the device plugin's IDs
    they stand in for (one node serves that resource from one or the other).
    """
    located = _resource_plugin(net)
    if located is None and not sel.device_id:
        return
    index, resource = located if located is not None else (0, "")
    ids = [sel.device_id] if sel.device_id else pod.device_ids(resource) + _claimed(net, index, resource, pod)
    requested = pod.requested(resource) if resource and not ids else 0
    top = injected.setdefault(index, {})
    runtime = runtime_injected.setdefault(index, {})
    if ids:
        top["deviceID"] = ids[0]
        runtime["deviceID"] = ids[0]
        runtime["deviceIDs"] = ids
        top["count"] = len(ids)
    elif requested:
        top["count"] = requested
    log.info("network %s resource %r: device IDs %s, requested %d", net.name, resource, ids, requested)


def _claimed(net: conflist.NetworkConfigList, index: int, resource: str, pod: PodView) -> list[str]:
    """The RDMA device names of the bonds the pod's DRA claims hold, for the network that takes the
    node's RDMA resource; [] for any other network, or a pod without such claims."""
    if not resource or resource != pod.cfg.rdma_resource:
        return []
    found = pod.claim_devices()
    if not found:
        return []
    who = f"{pod.namespace}/{pod.name}"
    return claims.claimed_bonds(found, who, net.name, net.plugins[index])


def _resource_plugin(net: conflist.NetworkConfigList) -> tuple[int, str] | None:
    for i, plugin in enumerate(net.plugins):
        name = plugin.get("resourceName")
        if isinstance(name, str) and name:
            return i, name
    try:
        top = json.loads(net.raw).get("resourceName")
    except ValueError:
        return None
    return (0, top) if isinstance(top, str) and top else None


def _forward_gc(req: Request, cfg: MultusConfig, live: Sequence[AttachmentPlan]) -> None:
    """GC every network we know, telling each which of its attachments are still in use."""
    nets: dict[str, conflist.NetworkConfigList] = {}
    valid: dict[str, list[tuple[str, str]]] = {}
    for plan in live:
        for d in plan.delegates:
            nets.setdefault(d.network, d.net())
            valid.setdefault(d.network, []).append((plan.container_id, d.ifname))
    for name in cfg.default_delegates:
        try:
            nets[name] = conflist.load(cfg.conf_dir, name)
        except CniError as err:
            log.warning("GC: default network %s cannot be loaded: %s", name, err.msg)
    dirs = cfg.delegate_dirs(req.path)
    for name, net in nets.items():
        gc_network(net, valid.get(name, []), dirs, req.env, cfg.delegate_timeout)
