"""How the suite runs in parallel (``scripts/test``: pytest-xdist workers), in one place with the why.

- ``SERIAL``: tests that must run alone, in a second pytest run without workers, because what they
  read is machine-wide (CPU time, memory of a process tree on a busy CPU, SCHED_IDLE work that a busy
  CPU never lets run) or because they pin timing that other workers' load would break.
- ``GROUPS``: tests that share one worker, one after another (``--dist loadgroup``): a module-scoped
  fixture too expensive to make twice (the VM run), or runs that must not overlap each other (a demo
  run sweeps what dead demo runs left: a second demo must not sweep the one a test killed on purpose).
- ``FIRST``: the long ones, handed out before the rest (in its order) so the short tests fill in
  around them; cluster modules that share one cluster stand together there.
- ``QUICK``: ``scripts/test --quick``, the inner loop: every module's job touched once (the pure core,
  one real-netns round trip per plugin, the device plugin against the test kubelet, the agent).

Entries name a test file (``test_x.py``: every test in it), a test (``test_x.py::test_y``: each of
its parameters), or one parameter (``test_x.py::test_y[p]``). An entry that names no collected test
while its file was collected whole is an error: a renamed test must not quietly leave the schedule.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import pytest

# fmt: off
SERIAL: Mapping[str, str] = {
    "agent/test_agent_prefault.py": "prefault runs under SCHED_IDLE: on CPUs the other workers keep busy it "
    "gets no time at all, and these tests watch it run and stop",
    "agent/test_agent_pool.py::test_the_default_pool_is_prefork_idle_workers_and_only_warm_workers_hold_the_hot_pages":
    "reads the workers' private dirty memory against the hot pages, which SCHED_IDLE prefault copies",
    "agent/test_agent_pool.py::test_agent_rss_with_the_plugin_stack_loaded_is_inside_the_daemonset_limit":
    "a memory bound of a process tree",
    "agent/test_metrics_agent.py::test_prometheus_sees_the_bond_lent_to_the_pod_then_back_on_the_host":
    "asserts the warm ADD lands in the 1 s histogram bucket: a duration",
    "agent/test_metrics_agent.py::test_doctor_says_where_the_metrics_are_and_whether_they_answer":
    "the doctor gives /metrics the product's short HTTP timeout, which busy CPUs overran (WARN)",
    "ship/test_install_bundle.py::test_build_without_client_links_the_plugins_to_the_bundle":
    "its own PyInstaller build would queue behind the shared bundle's for the cache lock, and its "
    "300 s bound counts the wait",
}

GROUPS: Mapping[str, str] = {
    # one module-scoped VM run (the scenario) read by ten tests, and two more boots: one TCG guest
    # at a time takes one of the two CPUs, not both
    "vm/test_vm_e2e.py": "vm",
    # scripts/demo sweeps the namespaces of dead demo runs: a second demo at the same time would sweep
    # the run test_a_killed_run_is_swept_by_the_next_one killed before it looks
    "ship/test_ship_demo.py": "demo",
    "ship/test_install_bundle.py::test_demo_runs_on_the_installed_bundle": "demo",
    "ship/test_ship_demo_shared.py": "demo",
    # one real cluster per machine (fixed namespace names, mount points, cgroups): its tests share a
    # worker and one module-scoped cluster (the images' registry test runs its own registry and
    # containerd in a namespace of its own: it is not one of them)
    "cluster/test_cluster_e2e.py": "cluster",
    "cluster/test_cluster_dra.py": "cluster",
    "cluster/test_cluster_sweep.py": "cluster",
    "cluster/test_cluster_multus.py": "cluster",
    "release/test_release_cluster.py": "cluster",
    "upgrade/test_upgrade_cluster.py": "cluster",
    # a rollout of the DaemonSet under pod churn: no rejected pod, no failed CNI call
    "cluster/test_cluster_rollout.py": "cluster",
}

FIRST: tuple[str, ...] = (
    # one 2-node cluster for the three, in this order (tests/cluster/cluster.py SHARED_HELM)
    "cluster/test_cluster_e2e.py",
    "cluster/test_cluster_rollout.py",
    "release/test_release_cluster.py",
    "plugins/macvlan/test_macvlan_concurrency.py::test_200_concurrent_add_del_cycles_leave_nothing_behind",
    "vm/test_vm_e2e.py",
    "ship/test_ship_demo.py",
    "ship/test_install.py",
    "ship/test_install_bundle.py",
    "ship/test_install_agent.py",
    "ship/test_install_rdma_mode.py",
    # a clean clone's setup and PyInstaller build (~90 s): handed out last it ended the parallel pass
    # 75 s after every other worker (seen)
    "ship/test_ship_readme_build.py",
)

QUICK: tuple[str, ...] = (
    # the pure core: protocol, records, codecs, configs, models (no namespace, milliseconds each)
    "cni/test_dispatch.py",
    "cni/test_result.py",
    "ship/test_conf.py",
    "core/test_state.py",
    "net/test_rtcodec.py",
    "rdma/test_rdma_records.py",
    "rdma/test_rdma_gid.py",
    "rdma/test_rdma_sysfs.py",
    "sim/test_sim_model.py",
    "plugins/multus/test_multus_plan.py",
    "plugins/multus/test_multus_status.py",
    "plugins/multus/test_multus_networks.py",
    "devices/test_devices_model.py",
    "devices/test_devices_pci.py",
    "devices/test_devices_config.py",
    "devices/test_devices_pools.py",
    "devices/test_devices_poolconf.py",
    "plugins/ipvlan/test_ipvlan_pool.py",
    "kube/test_kube_files.py",
    "cli/test_cni_tool_cache.py",
    "cli/test_cni_tool_conflist.py",
    "agent/test_agent_probe.py",
    # mechanisms against the real kernel
    "net/test_net_mechanisms.py::test_netlink_in_talks_to_the_netns_without_forking_and_returns_home",
    "net/test_net_mechanisms.py::test_routes_and_rules_are_replayed_exactly_after_the_kernel_flushed_them",
    "sim/test_sim_node.py::test_daemon_process_follows_a_move_and_stops_by_pid",
    "kube/test_kube_client.py::test_get_pod_with_each_kind_of_credential",
    "kube/test_kube_podresources.py::test_get_answers_one_pod_with_every_containers_devices_once",
    # one real-netns round trip per plugin: rdma-macvlan in-process and through the agent's C client,
    # with the simulated RDMA device; rdma-multus with its API server, then with rdma-macvlan under it
    "plugins/macvlan/test_macvlan_netns.py::test_one_bond_ip_move_round_trip_restores_node_exactly",
    "plugins/macvlan/test_macvlan_rdma.py::test_add_keeps_the_host_gid_index_records_it_and_del_gives_it_back",
    "plugins/multus/test_multus_netns.py::test_tke_pod_gets_eth0_from_default_and_net1_from_the_rdma_network",
    "plugins/multus/test_multus_rdma_macvlan.py::test_seed_pod_gets_eth0_and_both_bonds_and_del_gives_them_back",
    "cli/test_cni_tool.py::test_add_chains_plugins_in_order_and_caches_the_last_result",
    # rdma-ipvlan (shared mode): pods sharing every bond with addresses of their own, in-process and
    # through the agent
    "plugins/ipvlan/test_ipvlan_netns.py::test_pods_share_every_bond_with_their_own_addresses_ping_and_del_leaves_the_node_exact",
    # the device plugin against the test kubelet, and the allocation reaching the pod
    "deviceplugin/test_deviceplugin_grpc.py::test_registers_and_lists_every_bond_with_its_numa_node",
    "deviceplugin/test_deviceplugin_pools_grpc.py::test_seed_002s_config_json_with_a_second_pool_registers_both_and_allocates_exactly_their_hcas",
    "deviceplugin/test_e2e_deviceplugin_multus.py::test_kubelet_allocates_4_of_8_and_the_pod_gets_exactly_those_bonds_and_devices",
    # the agent: its answer is the in-process one, through the Python and the C client
    "agent/test_agent.py::test_agent_answer_equals_the_in_process_answer",
    "agent/test_agent_c_client.py::test_c_client_answer_equals_the_in_process_answer",
    "agent/test_agent_macvlan.py::test_agent_and_in_process_give_the_same_results_and_host_changes",
    # node checks and metrics read the same node
    "doctor/test_doctor.py::test_healthy_node_from_the_real_kernel_capture_is_all_ok",
    "agent/test_metrics.py::test_bonds_holders_lost_and_gid_indices",
)
# fmt: on


def workers() -> int:
    """``RDMA_CNI_TEST_WORKERS``, else two per CPU (most tests wait on processes and netlink, not on
    the CPU), at most 8."""
    given = os.environ.get("RDMA_CNI_TEST_WORKERS", "")
    return int(given) if given.isdigit() else min(2 * (os.cpu_count() or 1), 8)


def configure_pass(config: pytest.Config, which: str) -> None:
    """Set up scripts/test's pass ``which`` (``parallel`` or ``alone``; anything else: pytest as
    invoked). Without pytest-xdist the parallel pass runs every test in this process and the other
    pass none. ``-n`` given by hand sets the parallel pass's workers."""
    if which not in ("parallel", "alone"):
        return
    if hasattr(config, "workerinput"):
        # A worker takes --dist from its own command line, which scripts/test leaves as the user gave
        # it: without this it never tags the GROUPS tests, and the controller's loadgroup then spreads
        # them like load (four VM scenarios at once were seen, and two demos sweeping each other).
        config.option.loadgroup = which == "parallel"
        # ... and --serial likewise: the worker's collection is what runs, so it must leave out what
        # the alone pass runs (a doctor /metrics fetch timed out on a loaded worker)
        if which == "parallel":
            config.option.serial = "exclude"
        return
    xdist = config.pluginmanager.hasplugin("xdist") and workers() > 1
    if which == "alone":
        config.option.serial = "only" if xdist else "none"
        if xdist:
            config.option.numprocesses, config.option.dist, config.option.tx = 0, "no", []
        return
    if not xdist:
        return  # serial "include": everything, here
    n = config.option.numprocesses or workers()
    config.option.serial = "exclude"
    config.option.numprocesses, config.option.dist, config.option.tx = n, "loadgroup", ["popen"] * n


def matches(entry: str, nodeid: str) -> bool:
    """``entry`` (relative to tests/) names the test ``nodeid`` (as pytest spells it)."""
    test = nodeid.removeprefix("tests/")
    return test == entry or test.startswith((f"{entry}::", f"{entry}["))


def _rank(entries: tuple[str, ...], nodeid: str) -> int:
    """The index of the first of ``entries`` naming ``nodeid``, or ``len(entries)``."""
    return next((i for i, e in enumerate(entries) if matches(e, nodeid)), len(entries))


def _first_match(entries: Iterable[str], nodeid: str) -> str | None:
    return next((e for e in entries if matches(e, nodeid)), None)


def check_entries(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every entry must name a collected test when its file was collected whole."""
    if any("::" in arg for arg in config.args) or config.getoption("keyword") or config.getoption("markexpr"):
        return  # a selection narrower than whole files: entries may rightly match nothing
    alone = [i.nodeid for i in items if _first_match(QUICK, i.nodeid) and _first_match(SERIAL, i.nodeid)]
    if alone:
        raise pytest.UsageError(f"tests/suite_plan.py: QUICK holds tests that must run alone: {alone}")
    files = {item.nodeid.split("::")[0].removeprefix("tests/") for item in items}
    for table in (SERIAL, GROUPS, FIRST, QUICK):
        for entry in table:
            if entry.split("::")[0] in files and not any(matches(entry, i.nodeid) for i in items):
                raise pytest.UsageError(f"tests/suite_plan.py names {entry!r}, which is no test (renamed?)")


def apply(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark, order and select ``items`` as the tables and the command line (``--serial``,
    ``--quick``) say."""
    check_entries(config, items)
    for item in items:
        if _first_match(SERIAL, item.nodeid) is not None:
            item.add_marker(pytest.mark.serial)
        group = next((g for e, g in GROUPS.items() if matches(e, item.nodeid)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        elif item.get_closest_marker("serial") is not None:
            # run with workers but without --serial exclude (``pytest -n 4`` by hand): at least
            # never two of them at once
            item.add_marker(pytest.mark.xdist_group("serial"))
    # FIRST's entries in its order, then the rest; stable: within each rank collection order is kept
    items.sort(key=lambda item: _rank(FIRST, item.nodeid))
    keep, drop = [], []
    serial = config.getoption("serial")
    quick = config.getoption("quick")
    for item in items:
        is_serial = item.get_closest_marker("serial") is not None
        wanted = (
            serial != "none"
            and (serial == "include" or (serial == "only") == is_serial)
            and (not quick or _first_match(QUICK, item.nodeid) is not None)
        )
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def serial_files() -> list[str]:
    """The files SERIAL names tests of, as paths from the repository: what the alone pass collects."""
    return sorted({f"tests/{entry.split('::')[0]}" for entry in SERIAL})


if __name__ == "__main__":  # scripts/test: python tests/suite_plan.py --serial-files
    import sys

    if sys.argv[1:] != ["--serial-files"]:
        sys.exit("usage: suite_plan.py --serial-files")
    print("\n".join(serial_files()))
