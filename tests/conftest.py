"""Shared pytest fixtures. ``node_ns``: a node + switch netns pair from :mod:`netns`, removed afterwards.

A test module marked ``both_modes`` runs every test that uses ``node_ns`` twice: with the plugin
run in-process (``python -m rdma_cni.cli.macvlan``) and as shipped (the C client answered by an
``rdma-agent``, fallback disabled). ``in_process_only`` keeps a test to the first (it signals the
plugin's own process, which in agent mode is the client, not the worker doing the work);
``agent_only`` to the second (a load test whose cold cell would prove nothing more, at minutes of CPU).

``--serial include|exclude|only`` and ``--quick`` select by :mod:`suite_plan`, which also marks the
tests that share a worker or run alone (``scripts/test`` runs the suite in two passes with them).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import suite_plan
from netns import Node, can_run, node

# Most of the suite runs the plugins with configs that put records, sysfs and logs in each test's
# own directories, as a node's admin may: the node policy that lets configs decide
# (rdma_cni.node_policy, trust: configs). Every plugin process the tests start inherits it. The
# tenant tests (marked tenant) and the shipped-config tests give the policy a node really has.
TRUST_CONFIGS_POLICY = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "node-policy-trust-configs.json")
os.environ.setdefault("RDMA_CNI_NODE_POLICY", TRUST_CONFIGS_POLICY)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rdma-cni", "rdma-cni test schedule (tests/suite_plan.py)")
    group.addoption(
        "--serial",
        choices=("include", "exclude", "only"),
        default="include",
        help="the tests that must run alone: with the rest (default), left out (the parallel pass of "
        "scripts/test) or only them (its second pass, without workers)",
    )
    group.addoption(
        "--quick",
        action="store_true",
        help="only the inner-loop set (tests/suite_plan.py QUICK): every module touched once",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the worker count into workers
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``RDMA_CNI_TEST_PASS`` (set by scripts/test, which runs pytest twice with the same arguments):
    ``parallel`` runs what may share the machine on xdist workers, ``alone`` the rest without any."""
    suite_plan.configure_pass(config, os.environ.get("RDMA_CNI_TEST_PASS", ""))


@pytest.hookimpl(tryfirst=True)  # before xdist renames grouped tests and before -k/-m deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite_plan.apply(config, items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker of the parallel pass whose grouped tests xdist did not rename runs each group on
    every worker at once (pytest 9.2 with xdist 3.8 did: four VM scenarios on two CPUs): stop."""
    if hasattr(session.config, "workerinput") and session.config.getvalue("loadgroup"):
        grouped = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group")]
        lost = [nodeid for nodeid in grouped if "@" not in nodeid]
        if lost:
            raise pytest.UsageError(
                f"pytest-xdist did not tag {len(lost)} grouped tests (e.g. {lost[0]}) with their group: "
                "this pytest and pytest-xdist do not work together; see pyproject.toml's pin"
            )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The test cluster the last cluster module of this process kept up for a next one goes down
    (tests/cluster/cluster.py ``shared``); a process that imported no cluster module has none."""
    kept = sys.modules.get("cluster.cluster")
    if kept is not None:
        kept.down_if_kept()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "node_ns" not in metafunc.fixturenames or not metafunc.definition.get_closest_marker("both_modes"):
        return
    modes = ["in-process", "agent"]
    if metafunc.definition.get_closest_marker("in_process_only"):
        modes = ["in-process"]
    elif metafunc.definition.get_closest_marker("agent_only"):
        modes = ["agent"]
    metafunc.parametrize("node_ns", modes, indirect=True)


@pytest.fixture
def node_ns(request: pytest.FixtureRequest) -> Iterator[Node]:
    reason = can_run()
    if reason:
        pytest.skip(reason)
    with node(getattr(request, "param", "in-process")) as n:
        yield n


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """``RDMA_CNI_TEST_CPU=FILE``: one JSON line per test with the CPU seconds it cost (this process
    and every child it reaped: plugins, daemons, qemu), to find what fills the 2 CPUs of a run."""
    path = os.environ.get("RDMA_CNI_TEST_CPU")
    if not path:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    c0, t0 = cpu(), time.monotonic()
    yield
    line = {"test": item.nodeid, "cpu": round(cpu() - c0, 2), "wall": round(time.monotonic() - t0, 2)}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
