"""rdma-device-plugin against the test kubelet, over real gRPC on unix sockets: the real plugin process
in a node netns of simulated RDMA bonds (tests/dpnode.py), kubelet's behaviour from tests/kubelet.py.

Timings are printed (run with -s to see them), not asserted: scripts/bench-deviceplugin measures them.
Bounds below are only the waits after which a test gives up.
"""

from __future__ import annotations

import os
import signal
import stat
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from dpnode import RESOURCE, dp_node, wait_for
from netns import REPO, can_run

from rdma_cni.proto import deviceplugin_v1beta1_pb2 as pb
from rdma_cni.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from rdma_cni.sim.kubelet import Dev, TestKubelet
from rdma_cni.sim.tree import set_port_state

pytestmark = pytest.mark.netns


@pytest.fixture(autouse=True)
def _root() -> None:
    reason = can_run()
    if reason:
        pytest.skip(reason)


def healthy(devs: list[Dev], dev_id: str) -> bool | None:
    for d in devs:
        if d.id == dev_id:
            return d.health == "Healthy"
    return None


def test_registers_and_lists_every_bond_with_its_numa_node() -> None:
    with dp_node(bonds=8, numa=lambda i: i // 4) as d:
        d.start()
        ep = d.endpoint()
        assert ep.options.get_preferred_allocation_available and not ep.options.pre_start_required
        _, devs = ep.wait_list(lambda devs: len(devs) == 8 and all(x.health == "Healthy" for x in devs))
        assert devs == [Dev(f"mlx5_bond_{i}", "Healthy", (i // 4,)) for i in range(8)]
        assert ep.endpoint.startswith("tke-shared-rdma-") and ep.endpoint.endswith(".sock")
        assert d.kubelet.rejected == []
        wait_for(lambda: d.status()["registered"], 5, "status.json saying registered")
        status = d.status()
        assert status["resourceName"] == RESOURCE
        assert status["registrations"] == 1 and status["endpoint"] == ep.endpoint
        assert [(x["id"], x["netdev"], x["numa"], x["healthy"]) for x in status["devices"]] == [
            (f"mlx5_bond_{i}", f"bond{i}", i // 4, True) for i in range(8)]
        # kubelet asks for 4 of 8 (admission with a choice): one answer, 4 IDs, all given out.
        picks = ep.preferred([f"mlx5_bond_{i}" for i in range(8)], [], 4)
        assert len(picks) == 4 and len({int(p.rsplit("_", 1)[1]) // 4 for p in picks}) == 1
        resp = ep.allocate(["mlx5_bond_5"], ["mlx5_bond_6"])
        assert len(resp.container_responses) == 2
        first = resp.container_responses[0]
        paths = {(s.container_path, s.host_path) for s in first.devices}
        assert ("/dev/infiniband/uverbs5", os.path.join(d.dev, "infiniband", "uverbs5")) in paths
        assert first.envs["NCCL_IB_HCA"] == "=mlx5_bond_5"
        assert wait_for(lambda: d.status()["allocations"] == 2, 5, "allocations counted") >= 0


def test_numa_minus_one_leaves_topology_unset() -> None:
    with dp_node(bonds=2, numa=lambda i: -1) as d:
        d.start()
        _, devs = d.endpoint().wait_list(lambda devs: len(devs) == 2)
        assert [x.numa for x in devs] == [(), ()]


def test_health_follows_every_cause_both_ways_on_every_stream() -> None:
    """Link down/up, address removal/return, the RDMA port state and the uverbs node flip the device
    and flip it back; each change reaches kubelet's stream and a second concurrent stream; the
    latency is printed."""
    with dp_node(bonds=2) as d:
        d.start()
        ep = d.endpoint()
        ep.wait_list(lambda devs: healthy(devs, "mlx5_bond_0") is True)
        with grpc.insecure_channel(f"unix:{os.path.join(d.kubelet.dir, ep.endpoint)}") as ch:
            extra = pb_grpc.DevicePluginStub(ch).ListAndWatch(pb.Empty(), timeout=120)
            assert len(next(extra).devices) == 2
            uverbs = os.path.join(d.dev, "infiniband", "uverbs0")
            dev_numbers = os.stat(uverbs).st_rdev
            steps: list[tuple[str, Callable[[], object], bool]] = [
                ("link down", lambda: d.n.ip("link", "set", "bond0", "down"), False),
                ("link up", lambda: d.n.ip("link", "set", "bond0", "up"), True),
                ("address removed", lambda: d.n.ip("addr", "del", "198.51.100.2/28", "dev", "bond0"), False),
                ("address back", lambda: d.n.ip("addr", "add", "198.51.100.2/28", "dev", "bond0"), True),
                # No event for these two: the rescan finds them.
                ("RDMA port DOWN", lambda: set_port_state(d.sysfs, "mlx5_bond_0", 1, active=False), False),
                ("RDMA port ACTIVE", lambda: set_port_state(d.sysfs, "mlx5_bond_0", 1, active=True), True),
                ("uverbs0 node gone", lambda: os.unlink(uverbs), False),
                ("uverbs0 node back", lambda: os.mknod(uverbs, 0o666 | stat.S_IFCHR, dev_numbers), True),
            ]
            for what, change, want in steps:
                seen = len(ep.lists)
                t0 = time.monotonic()
                change()
                t, _ = ep.wait_list(lambda devs, w=want: healthy(devs, "mlx5_bond_0") is w, 10, seen)  # type: ignore[misc]
                print(f"\nhealth {what} -> kubelet: {(t - t0) * 1000:.0f} ms")
                for msg in extra:  # the second stream gets the same change
                    if (msg.devices[0].ID, msg.devices[0].health == "Healthy") == ("mlx5_bond_0", want):
                        break
                assert healthy(ep.latest() or [], "mlx5_bond_1") is True
            extra.cancel()
        # A client other than kubelet closing its stream is not a kubelet restart.
        time.sleep(0.5)
        assert d.kubelet.register_calls == 1 and ep.live
        status = d.status()
        assert [x["healthy"] for x in status["devices"]] == [True, True]


def test_twenty_kubelet_restarts_each_re_registered_no_stream_left_behind() -> None:
    with dp_node(bonds=2) as d:
        d.start()
        ep = d.endpoint()
        ep.wait_list(lambda devs: len(devs) == 2)
        took = []
        for _ in range(20):
            t0 = time.monotonic()
            d.kubelet.restart()
            ep = d.kubelet.wait_endpoint(RESOURCE, newer_than=None, timeout=15)
            took.append(ep.registered_at - t0)
            ep.wait_list(lambda devs: len(devs) == 2 and all(x.health == "Healthy" for x in devs))
        print(f"\nre-registration after a kubelet restart: median {statistics.median(took) * 1000:.0f} ms, "
              f"max {max(took) * 1000:.0f} ms over {len(took)}")
        wait_for(lambda: d.kubelet.live_streams() == 1, 5, "exactly one live ListAndWatch")
        assert d.kubelet.rejected == []
        # The status file names the live registration. Its count is what the plugin saw accepted: a
        # kubelet stopped right after accepting may never deliver the answer, so kubelet's can be higher.
        wait_for(lambda: d.status()["registered"] and d.status()["endpoint"] == ep.endpoint, 5,
                 "status.json naming the current endpoint")

        def accepted() -> int:
            with open(d.log) as f:
                return f.read().count(f"registered {RESOURCE} as ")

        def ready() -> int:  # counted once kubelet took it and its stream sent the first list
            with open(d.log) as f:
                return f.read().count(f"kubelet streams {RESOURCE}'s devices from ")

        # a kubelet restarted between its Register answer and its first ListAndWatch never streamed
        # that registration: the status counts only those that did
        wait_for(lambda: d.status()["registrations"] == ready(), 5, "one log line per ready registration")
        assert ready() <= accepted() <= len(d.kubelet.history)
        # Each start served a new socket; kubelet's cleanups removed the old ones, ours is the only one.
        socks = sorted(f for f in os.listdir(d.kubelet.dir) if f.startswith("tke-shared-rdma-"))
        assert socks == [ep.endpoint]


def inotify_watches(pid: int) -> list[tuple[int, int]]:
    """(inode, mask) of every inotify watch the process holds, as the kernel lists them in fdinfo."""
    out = []
    fds = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fds):
        try:
            with open(os.path.join(fds, fd)) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:  # closed meanwhile
            continue
        for line in lines:
            if line.startswith("inotify wd:"):
                fields = dict(part.split(":", 1) for part in line.split()[1:])
                out.append((int(fields["ino"], 16), int(fields["mask"], 16)))
    return out


@pytest.mark.parametrize("inotify", ["on", "off"])
def test_a_kubelet_restart_is_seen_through_inotify_on_kubelets_directory_or_by_polling_without(
    monkeypatch: pytest.MonkeyPatch, inotify: str
) -> None:
    """With inotify the plugin process holds a watch on the device-plugins directory for creates and
    deletes (the kernel's own list, /proc/PID/fdinfo) and says so; RDMA_CNI_INOTIFY=off makes it poll
    (no watch, a WARN naming why). A kubelet restart is answered either way."""
    from rdma_cni.kube.dirwatch import ENV_SWITCH, IN_CREATE, IN_DELETE

    if inotify == "off":
        monkeypatch.setenv(ENV_SWITCH, "off")
    with dp_node(bonds=2) as d:
        proc = d.start()
        first = d.endpoint()
        first.wait_list(lambda devs: len(devs) == 2)
        directory = os.stat(d.kubelet.dir).st_ino
        watches = [mask for ino, mask in inotify_watches(proc.pid) if ino == directory]
        if inotify == "on":
            assert len(watches) == 1 and watches[0] & IN_CREATE and watches[0] & IN_DELETE, watches
            assert f"watching {d.kubelet.dir} with inotify" in d.log_text()
        else:
            assert watches == []
            assert f"polling {d.kubelet.dir} every 100 ms: {ENV_SWITCH}=off" in d.log_text()
        d.kubelet.restart()
        ep = d.kubelet.wait_endpoint(RESOURCE, newer_than=first, timeout=15)
        assert ep.endpoint != first.endpoint
        ep.wait_list(lambda devs: len(devs) == 2)
        assert d.stop(proc) == 0  # a stop ends the long inotify wait at once: a clean exit


def test_kubelet_dropping_the_stream_gets_a_new_registration() -> None:
    """kubelet ends the stream and forgets the endpoint (no restart, no socket deleted): the plugin
    must notice the stream's end and register again, on a new socket."""
    with dp_node(bonds=2) as d:
        d.start()
        old = d.endpoint()
        old.wait_list(lambda devs: len(devs) == 2)
        t0 = time.monotonic()
        d.kubelet.drop(RESOURCE)
        ep = d.kubelet.wait_endpoint(RESOURCE, newer_than=old, timeout=15)
        print(f"\nre-registration after kubelet dropped the stream: {(ep.registered_at - t0) * 1000:.0f} ms")
        assert ep.endpoint != old.endpoint
        ep.wait_list(lambda devs: len(devs) == 2)
        wait_for(lambda: d.kubelet.live_streams() == 1, 5, "one live ListAndWatch")


def test_what_allocate_gave_is_what_podresources_tells_the_cni_also_after_a_kubelet_restart() -> None:
    """kubelet admits a pod (GetPreferredAllocation, then Allocate of that choice) and answers
    PodResources with it, as the real one does; the CNI side's client reads exactly those IDs."""
    from podresources_server import PodResourcesServer

    from rdma_cni.kube import podresources

    pr = PodResourcesServer("")  # served by the test kubelet on its own pod-resources socket
    with dp_node(bonds=8, numa=lambda i: i // 4, pod_resources=pr.add_to) as d:
        d.start()
        ep = d.endpoint()
        _, devs = ep.wait_list(lambda devs: len(devs) == 8 and all(x.health == "Healthy" for x in devs))
        picks = ep.preferred([x.id for x in devs], ["mlx5_bond_6"], 4)
        assert "mlx5_bond_6" in picks and len(picks) == 4
        resp = ep.allocate(picks)
        assert resp.container_responses[0].envs["NCCL_IB_HCA"] == "=" + ",".join(sorted(picks))
        pr.set_pod("default", "nccl-test-0", {"trainer": {RESOURCE: picks}})
        sock = podresources.socket_path(d.kubelet.pod_resources_dir)
        got = podresources.pod_devices(sock, "default", "nccl-test-0")
        assert got is not None and sorted(got[RESOURCE]) == sorted(picks)
        d.kubelet.restart()  # both sockets come back; the plugin registers again
        d.kubelet.wait_endpoint(RESOURCE, timeout=15).wait_list(lambda devs: len(devs) == 8)
        got = podresources.pod_devices(sock, "default", "nccl-test-0")
        assert got is not None and sorted(got[RESOURCE]) == sorted(picks)


def test_two_instances_do_not_take_the_registration_back_and_forth() -> None:
    """A rolling update overlap: the newer plugin registers, kubelet drops the older's stream; the
    older stands by (no re-registration ping-pong) and takes over once the newer stops."""
    with dp_node(bonds=2) as d:
        d.start()
        first = d.endpoint()
        first.wait_list(lambda devs: len(devs) == 2)
        newer = d.start(previous=first)
        second = d.endpoint()
        second.wait_list(lambda devs: len(devs) == 2)
        calls = d.kubelet.register_calls
        time.sleep(3)
        assert d.kubelet.register_calls == calls, "the two instances took the registration back and forth"
        assert d.kubelet.endpoints[RESOURCE] is second and second.live
        wait_for(lambda: "standing by" in d.log_text(), 5, "the older instance standing by")
        t0 = time.monotonic()
        assert d.stop(newer) == 0
        ep = d.kubelet.wait_endpoint(RESOURCE, newer_than=second, timeout=15)
        print(f"\nolder instance took over {(ep.registered_at - t0) * 1000:.0f} ms after the newer stopped")
        ep.wait_list(lambda devs: len(devs) == 2)
        assert d.procs[0].poll() is None


def test_kill9_then_restart_registers_the_full_list_and_leaves_pods_alone() -> None:
    with dp_node(bonds=2) as d:
        pod = d.n.pod()  # a running pod holding bond1's macvlan and address
        d.n.ip("link", "add", "link", "bond1", "name", "mvp", "netns", pod.name, "type", "macvlan")
        d.n.pod_exec(pod, "ip", "addr", "add", "203.0.113.5/24", "dev", "mvp")
        d.n.pod_exec(pod, "ip", "link", "set", "mvp", "up")
        before = d.n.pod_exec(pod, "ip", "-4", "-j", "addr").stdout
        proc = d.start()
        first = d.endpoint()
        first.wait_list(lambda devs: len(devs) == 2)
        d.stop(proc, signal.SIGKILL)
        assert os.path.exists(os.path.join(d.kubelet.dir, first.endpoint))  # kill -9 cannot clean up
        d.start(previous=first)
        ep = d.endpoint()
        _, devs = ep.wait_list(lambda devs: len(devs) == 2 and all(x.health == "Healthy" for x in devs))
        assert [x.id for x in devs] == ["mlx5_bond_0", "mlx5_bond_1"]
        assert not os.path.exists(os.path.join(d.kubelet.dir, first.endpoint)), "stale socket left"
        assert d.n.pod_exec(pod, "ip", "-4", "-j", "addr").stdout == before


def test_allocate_unknown_or_malformed_is_an_answer_not_a_crash() -> None:
    with dp_node(bonds=2) as d:
        d.start()
        ep = d.endpoint()
        ep.wait_list(lambda devs: len(devs) == 2)
        with pytest.raises(grpc.RpcError) as err:
            ep.allocate(["mlx5_bond_0", "mlx5_bond_9"])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "mlx5_bond_9" in (err.value.details() or "")
        try:  # a container request without IDs: refused or answered, never a crash
            ep.allocate([])
        except grpc.RpcError as e:
            assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
        assert len(ep.stub.Allocate(pb.AllocateRequest(), timeout=5).container_responses) == 0
        # GetPreferredAllocation never fails, whatever kubelet sends.
        for available, must, size in ([], [], 3), (["x", "x"], ["y"], -5), (["mlx5_bond_0"], [], 40):
            ep.preferred(available, must, size)
        # Bytes that are not the message (wrong wire types) reach the server as garbage.
        path = os.path.join(d.kubelet.dir, ep.endpoint)
        with grpc.insecure_channel(f"unix:{path}") as ch:
            for method in ("Allocate", "GetPreferredAllocation", "PreStartContainer"):
                call = ch.unary_unary(f"/v1beta1.DevicePlugin/{method}")
                with pytest.raises(grpc.RpcError) as bad:
                    call(b"\x0a\xff\xff\xff\xff\x0f\x01", timeout=5)
                assert bad.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
            pre = pb_grpc.DevicePluginStub(ch).PreStartContainer(
                pb.PreStartContainerRequest(devices_ids=["mlx5_bond_0"]), timeout=5)
            assert pre == pb.PreStartContainerResponse()
        resp = ep.allocate(["mlx5_bond_1"])  # still serving, still registered once
        assert resp.container_responses[0].envs["NCCL_IB_HCA"] == "=mlx5_bond_1"
        assert d.kubelet.register_calls == 1 and d.procs[0].poll() is None


def test_waits_for_an_absent_kubelet_logging_once_then_registers() -> None:
    with dp_node(bonds=2, kubelet=False) as d:
        os.makedirs(d.kubelet.dir)
        proc = d.start(wait=False)
        wait_for(lambda: "no kubelet at" in d.log_text(), 20, "the plugin saying kubelet is absent")
        time.sleep(1.5)  # ~15 polls
        d.kubelet.start()
        ep = d.endpoint()
        ep.wait_list(lambda devs: len(devs) == 2)
        with open(d.log) as f:
            assert f.read().count("no kubelet at") == 1, d.log_tail()
        assert proc.poll() is None


def test_sigterm_removes_the_own_socket() -> None:
    with dp_node(bonds=2) as d:
        proc = d.start()
        ep = d.endpoint()
        path = os.path.join(d.kubelet.dir, ep.endpoint)
        assert os.path.exists(path)
        assert d.stop(proc) == 0
        assert not os.path.exists(path)
        assert d.status()["registered"] is False
        wait_for(lambda: not ep.live, 5, "kubelet's stream ended")


def _run_plugin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rdma_cni.cli.device_plugin", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))


def test_bad_flag_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    out = _run_plugin("--rescan-interval", "soon", "--cni-conf", "/nonexistent/x.conf")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--rescan-interval" in lines[0] and "soon" in lines[0], out.stderr


def test_exclusive_rdma_netns_mode_refuses_to_start(tmp_path: Path) -> None:
    from rdma_cni.sim.tree import SimBond, build_tree

    root = os.path.join(str(tmp_path), "sys")
    build_tree(root, [SimBond("bond0", "mlx5_bond_0")], gid_slots=8, netns_mode="exclusive")
    k = TestKubelet(os.path.join(str(tmp_path), "kubelet"))
    out = _run_plugin("--sysfs-root", root, "--kubelet-root-dir", k.root, "--cni-conf", "/nonexistent/x.conf",
                      "--log-file", "")
    assert out.returncode == 1
    assert "shared" in out.stderr and "exclusive" in out.stderr, out.stderr
    assert not os.path.exists(k.dir) or os.listdir(k.dir) == []
