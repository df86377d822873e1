"""How the suite runs in parallel (``scripts/test``: pytest-xdist workers), in one place with the why.

- ``SERIAL``: tests that must run alone, in a second pytest run without workers, because what they
  read is machine-wide (CPU time, memory of a process tree on a busy CPU, SCHED_IDLE work that a busy
  CPU never lets run) or because they pin timing that other workers' load would break.
- ``GROUPS``: tests that share one worker, one after another (``--dist loadgroup``): a module-scoped
  fixture too expensive to make twice (the VM run), or runs that must not overlap each other (a demo
  run sweeps what dead demo runs left: a second demo must not sweep the one a test killed on purpose).
- ``FIRST``: the long ones, handed out before the rest so the short tests fill in around them.
- ``QUICK``: ``scripts/test --quick``, the inner loop: every module's job touched once (the pure core,
  one real-netns round trip per plugin, the device plugin against the test kubelet, the agent).

Entries name a test file (``test_x.py``: every test in it), a test (``test_x.py::test_y``: each of
its parameters), or one parameter (``test_x.py::test_y[p]``). An entry that names no collected test
while its file was collected whole is an error: a renamed test must not quietly leave the schedule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

# fmt: off
SERIAL: Mapping[str, str] = {
    "test_agent_prefault.py": "prefault runs under SCHED_IDLE: on CPUs the other workers keep busy it "
    "gets no time at all, and these tests watch it run and stop",
    "test_agent.py::test_the_default_pool_is_prefork_idle_workers_and_only_warm_workers_hold_the_hot_pages":
    "reads the workers' private dirty memory against the hot pages, which SCHED_IDLE prefault copies",
    "test_agent.py::test_agent_rss_with_the_plugin_stack_loaded_is_inside_the_daemonset_limit":
    "a memory bound of a process tree",
    "test_metrics_agent.py::test_prometheus_sees_the_bond_lent_to_the_pod_then_back_on_the_host":
    "asserts the warm ADD lands in the 1 s histogram bucket: a duration",
}

GROUPS: Mapping[str, str] = {
    # one module-scoped VM run (the scenario) read by ten tests, and two more boots: one TCG guest
    # at a time takes one of the two CPUs, not both
    "test_vm_e2e.py": "vm",
    # scripts/demo sweeps the namespaces of dead demo runs: a second demo at the same time would sweep
    # the run test_a_killed_run_is_swept_by_the_next_one killed before it looks
    "test_ship_demo.py": "demo",
    "test_install.py::test_demo_runs_on_the_installed_bundle": "demo",
}

FIRST: tuple[str, ...] = (
    "test_macvlan_concurrency.py::test_200_concurrent_add_del_cycles_leave_nothing_behind",
    "test_vm_e2e.py",
    "test_ship_demo.py",
    "test_install.py",
)

QUICK: tuple[str, ...] = ()
# fmt: on


def matches(entry: str, nodeid: str) -> bool:
    """``entry`` (relative to tests/) names the test ``nodeid`` (as pytest spells it)."""
    test = nodeid.removeprefix("tests/")
    return test == entry or test.startswith((f"{entry}::", f"{entry}["))


def _first_match(entries: Iterable[str], nodeid: str) -> str | None:
    return next((e for e in entries if matches(e, nodeid)), None)


def check_entries(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every entry must name a collected test when its file was collected whole."""
    if any("::" in arg for arg in config.args) or config.getoption("keyword") or config.getoption("markexpr"):
        return  # a selection narrower than whole files: entries may rightly match nothing
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
    # stable: within each rank collection order is kept
    items.sort(key=lambda item: 0 if _first_match(FIRST, item.nodeid) is not None else 1)
    keep, drop = [], []
    serial = config.getoption("serial")
    quick = config.getoption("quick")
    for item in items:
        is_serial = item.get_closest_marker("serial") is not None
        wanted = (serial == "include" or (serial == "only") == is_serial) and (
            not quick or _first_match(QUICK, item.nodeid) is not None
        )
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
