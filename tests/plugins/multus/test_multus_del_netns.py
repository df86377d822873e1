"""rdma-multus's DEL on the netns node (``tests/multus_node.py``), and its recovery: DEL without
the API server or the netns, after a kill -9 mid-ADD, with an unreadable plan, a delegate that is
gone or refuses, a plan that names a plugin that can never run, a config broken after ADD; and an
ADD that fails part way, then is retried.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from netns import policy_env

from tests import multus_node
from tests.kube_server import KubeServer
from tests.multus_node import ANNOTATION, CLEAN_NODE, REF, Node, links, sh

pytestmark = pytest.mark.netns

# The node, API server and PKI fixtures of rdma-multus's netns tests (tests/multus_node.py).
pki = multus_node.pki
node = multus_node.node
api = multus_node.api


def test_del_after_the_api_server_is_gone_and_the_netns_too(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-rdma-macvlan")
    assert links(pod) == {"lo", "eth0", "net1"}
    api.stop()
    sh("ip", "netns", "del", pod)
    # containerd's second DEL (RemovePodSandbox): empty CNI_NETNS, no prevResult, no API server.
    code, out = node.run("DEL", conf, "c1", None)
    assert code == 0, out
    assert node.leftovers() == CLEAN_NODE
    code, out = node.run("DEL", conf, "c1", None)  # and again: idempotent
    assert code == 0, out


def test_del_with_the_netns_alive_and_no_api_removes_the_interfaces(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-rdma-macvlan@rdma0")
    assert links(pod) == {"lo", "eth0", "rdma0"}
    api.stop()
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_kill_9_between_delegates_then_del_restores_everything(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """The plan is on disk before the first delegate runs, so a crash mid-ADD is undone by DEL."""
    marker = tmp_path / "second-delegate-started"
    hang = node.bin_dir / "hanging-macvlan"
    hang.write_text(f"#!/bin/sh\necho $$ > {marker}.tmp && mv {marker}.tmp {marker}\nexec sleep 60\n")
    hang.chmod(0o755)
    node.network("h5-hang", {"plugins": [{"type": "hanging-macvlan", "master": "bond0"}]})
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "h5-hang"})
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    pod = node.pod_netns()
    env = {
        "PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", **policy_env(), "CNI_CONTAINERID": "c1",
        "CNI_NETNS": f"/var/run/netns/{pod}", "CNI_IFNAME": "eth0", "CNI_PATH": str(node.bin_dir),
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=ibv-app-0",
    }  # fmt: skip
    proc = subprocess.Popen(
        ["ip", "netns", "exec", node.name, sys.executable, "-m", "rdma_cni.cli.multus"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(conf).encode())
    proc.stdin.close()
    try:
        for _ in range(600):
            if marker.exists() or proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert marker.exists(), proc.stderr.read() if proc.stderr else ""
        os.kill(proc.pid, 9)  # `ip netns exec` execs in place: this pid is rdma-multus itself
        proc.wait(timeout=10)
    finally:
        if marker.exists():
            os.kill(int(marker.read_text()), 9)  # the orphaned delegate we started
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    assert links(pod) == {"lo", "eth0"}  # the default network was added, then we died

    # The hanging delegate is replaced by one that works, as after a fix; DEL must finish the job.
    hang.unlink()
    hang.symlink_to(REF / "macvlan")
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_del_with_an_unreadable_plan_recovers_from_the_result_caches(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-route-eni,tke-rdma-macvlan")
    (plan,) = (node.cache_dir / "attachments").iterdir()
    plan.write_text('{"containerID": "c1", "delegates": [tor')  # a disk fault, not something we write
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_rollback_keeps_what_would_not_delete_for_the_runtimes_del(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """ADD fails at the 2nd network and the 1st refuses DEL: the plan keeps the 1st, DEL retries it."""
    flag, conf, pod = _failed_add_the_default_network_will_not_undo(
        node, api, tmp_path, msg="busy, try again"
    )
    assert links(pod) == {"lo", "eth0"}  # h5-flaky refused to go
    plan = json.loads((node.cache_dir / "attachments" / "c1-eth0.json").read_text())
    assert [d["network"] for d in plan["delegates"]] == ["h5-flaky"]
    code, out = node.run("DEL", conf, "c1", pod)
    assert code != 0 and out["code"] == 11  # still refusing: the runtime will retry
    flag.unlink()
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def _flaky_default_network(node: Node, flag: Path, msg: str = "delegate store unreachable") -> None:
    """Network ``h5-flaky``: ptp + host-local through a binary that answers DEL with error 11
    (``msg``) while ``flag`` exists, and otherwise runs the real ptp."""
    path = node.bin_dir / "flaky-ptp"
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$CNI_COMMAND" = DEL ] && [ -e {flag} ]; then\n'
        f'  echo \'{{"cniVersion":"1.0.0","code":11,"msg":"{msg}"}}\'; exit 1\n'
        "fi\n"
        f"exec {REF / 'ptp'}\n"
    )
    path.chmod(0o755)
    node.network("h5-flaky", {"plugins": [{
        "type": "flaky-ptp", "ipMasq": False,
        "ipam": {"type": "host-local", "dataDir": str(node.ipam_dir),
                 "ranges": [[{"subnet": "198.51.100.0/26"}]]}}]})  # fmt: skip


def _failed_add_the_default_network_will_not_undo(
    node: Node, api: KubeServer, tmp: Path, msg: str = "delegate store unreachable"
) -> tuple[Path, dict[str, Any], str]:
    """ADD of a pod whose 2nd network (h5-broken) fails while its 1st (h5-flaky) refuses DEL:
    (the flag that makes it refuse, the config, the pod netns)."""
    flag = tmp / "refuse-del"
    _flaky_default_network(node, flag, msg=msg)
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "h5-broken"})
    conf = node.config(api.kubeconfig(tmp / "kc"), defaultDelegates="h5-flaky")
    pod = node.pod_netns()
    flag.touch()
    code, err = node.run("ADD", conf, "c1", pod)
    assert code != 0 and "h5-broken" in err["msg"]
    return flag, conf, pod


def _assert_del_succeeds_then_the_next_pod_gets_its_networks(
    node: Node, conf: dict[str, Any], pod: str
) -> None:
    """The (retried) DEL of c1 succeeds and leaves nothing; then a pod c2 gets both networks."""
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c2", pod)
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "net1"}
    assert node.run("DEL", conf, "c2", pod)[0] == 0
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE


def _kept(node: Node) -> tuple[list[str], list[str]]:
    """(networks still in the plan of c1/eth0, result-cache files left)."""
    plan = json.loads((node.cache_dir / "attachments" / "c1-eth0.json").read_text())
    results = sorted(p.name for p in (node.cache_dir / "results").iterdir())
    return [d["network"] for d in plan["delegates"]], results


def test_del_with_a_delegate_binary_gone_deletes_the_others_and_keeps_only_it(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-route-eni,tke-rdma-macvlan")
    wrapper = node.bin_dir / "logged-macvlan"
    body = wrapper.read_text()
    wrapper.unlink()  # the RDMA network's plugin was uninstalled while the pod ran
    code, out = node.run("DEL", conf, "c1", pod)
    assert code != 0 and out["code"] == 7, out
    assert "tke-rdma-macvlan (net1)" in out["msg"] and "logged-macvlan" in out["msg"]
    assert links(pod) == {"lo", "net1"}  # the default network is deleted all the same
    assert _kept(node) == (["tke-rdma-macvlan"], ["tke-rdma-macvlan-c1-net1"])
    code, out = node.run("DEL", conf, "c1", pod)  # the retry tries only what is left
    assert code != 0 and out["code"] == 7
    wrapper.write_text(body)
    wrapper.chmod(0o755)
    _assert_del_succeeds_then_the_next_pod_gets_its_networks(node, conf, pod)


def test_del_with_a_failing_delegate_deletes_the_others_and_retries_only_it(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    flag = tmp_path / "refuse-del"
    _flaky_default_network(node, flag)
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-rdma-macvlan", defaultDelegates="h5-flaky")
    flag.touch()
    code, out = node.run("DEL", conf, "c1", pod)
    assert code != 0 and out["code"] == 11 and "h5-flaky (eth0)" in out["msg"], out
    assert links(pod) == {"lo", "eth0"}  # net1 went although the default network refused
    assert _kept(node) == (["h5-flaky"], ["h5-flaky-c1-eth0"])
    flag.unlink()
    _assert_del_succeeds_then_the_next_pod_gets_its_networks(node, conf, pod)


def test_a_delegate_type_that_can_never_run_is_skipped_on_del(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """ADD refuses a plugin type that is a path (7, before anything runs); a plan that holds one
    anyway (written by an older rdma-multus, or edited) is skipped on DEL with an error in the log,
    so the pod can still go away, and the other networks are deleted."""
    node.network("h5-pathy", {"plugins": [{"type": "../../../bin/sh"}]})
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "h5-pathy"})
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    pod = node.pod_netns()
    code, err = node.run("ADD", conf, "c1", pod)
    assert code != 0 and err["code"] == 7 and "plain executable name" in err["msg"], err
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-rdma-macvlan"})
    code, result = node.run("ADD", conf, "c1", pod)
    assert code == 0, result
    plan_file = node.cache_dir / "attachments" / "c1-eth0.json"
    plan = json.loads(plan_file.read_text())
    rdma = next(d for d in plan["delegates"] if d["network"] == "tke-rdma-macvlan")
    rdma["config"] = rdma["config"].replace('"logged-macvlan"', '"../../../bin/sh"')
    plan_file.write_text(json.dumps(plan))
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo", "net1"}  # eth0 deleted; net1's plugin could never be run
    assert "plugin type '../../../bin/sh' can never run: skipped" in (node.root / "multus.log").read_text()
    assert not plan_file.exists() and node.leftovers()["cache"] == []


def test_add_after_a_failed_add_undoes_the_recorded_attempt_first(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """ADD fails at the 2nd network and the 1st will not DEL; the runtime's retry with a fixed
    annotation undoes the recorded attempt by DEL's rules before it runs anything."""
    flag, conf, pod = _failed_add_the_default_network_will_not_undo(node, api, tmp_path)
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-rdma-macvlan"})
    code, err = node.run("ADD", conf, "c1", pod)  # the earlier attempt still will not go
    assert code != 0 and err["code"] == 11 and "earlier ADD" in err["msg"], err
    assert links(pod) == {"lo", "eth0"}
    flag.unlink()
    code, result = node.run("ADD", conf, "c1", pod)
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "net1"}
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE


def test_del_with_a_config_broken_after_add_still_deletes_every_network(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-route-eni,tke-rdma-macvlan")
    broken = {**conf, "apiTimeoutSeconds": "soon", "defaultDelegates": 5}
    code, out = node.run("DEL", broken, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    assert "using its default to clean up" in (node.root / "multus.log").read_text()
