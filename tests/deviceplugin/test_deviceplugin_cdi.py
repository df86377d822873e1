"""``rdma-device-plugin --cdi`` against the test kubelet over real gRPC: the real plugin process in a
node netns of simulated bonds (tests/dpnode.py, tests/poolnode.py), its Allocate answers checked
against the spec files it wrote, and those specs resolved by the CDI library containerd 2.4.2 uses
(tests/cdicheck, tags.cncf.io/container-device-interface v1.1.1): the nodes a container would get are
exactly those the default answer lists as DeviceSpecs, with the host's device numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import seed002
from dpnode import RESOURCE, DpNode, dp_node, wait_for
from netns import REPO, can_run
from poolnode import pool_node

from rdma_cni.proto import deviceplugin_v1beta1_pb2 as pb

pytestmark = pytest.mark.netns

CDICHECK = Path(__file__).resolve().parents[1] / "cdicheck"
SPEC = "tke.cloud.tencent.com-tke-shared-rdma_rdma-device-plugin.json"
POOL_A = "rdma/hca_shared_devices_a"  # seed 002's config.json: ifNames [ibs108] -> mlx5_4
POOL_B = "rdma/hca_shared_devices_b"
ROCE = [f"mlx5_bond_{i}" for i in range(4)]


@pytest.fixture(autouse=True)
def _root() -> None:
    reason = can_run()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def cdicheck(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tests/cdicheck built once for the module (Go's build cache makes a rebuild cheap)."""
    go = next((c for c in (os.environ.get("GO", ""), "/usr/local/go/bin/go", shutil.which("go") or "")
               if c and os.access(c, os.X_OK)), None)
    if go is None:
        pytest.skip("needs Go to build tests/cdicheck")
    binary = tmp_path_factory.mktemp("cdicheck") / "cdicheck"
    build = subprocess.run([go, "build", "-o", str(binary), "."], cwd=CDICHECK, capture_output=True,
                           text=True, env=dict(os.environ, GOFLAGS="-mod=mod"), timeout=300)
    if build.returncode != 0:
        pytest.skip(f"tests/cdicheck does not build here (no module cache or proxy?): {build.stderr[-300:]}")
    return str(binary)


def resolve(binary: str, spec_dir: str, *ids: str) -> tuple[list[str], list[str]]:
    """What the runtime's CDI library injects for ``ids``: (env lines, device lines), sorted; the
    library's refusal (a bad spec, an unknown ID) fails the test with its own words."""
    out = subprocess.run([binary, spec_dir, *ids], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    return sorted(x for x in lines if x.startswith("env ")), sorted(x for x in lines if x.startswith("dev "))


def dev_lines(specs: list[tuple[str, str]]) -> list[str]:
    """The ``dev`` lines cdicheck prints for (container path, host path) pairs: the host's numbers."""
    out = []
    for container, host in specs:
        rdev = os.stat(host).st_rdev
        out.append(f"dev {container} c {os.major(rdev)} {os.minor(rdev)}")
    return sorted(out)


def names(resp: pb.AllocateResponse) -> list[list[str]]:
    return [[c.name for c in r.cdi_devices] for r in resp.container_responses]


def spec_doc(spec_dir: str, name: str = SPEC) -> dict[str, Any]:
    with open(os.path.join(spec_dir, name)) as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def spec_devices(doc: dict[str, Any]) -> dict[str, list[str]]:
    return {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in doc["devices"]}


def node_paths(*numbers: int) -> list[str]:
    return [f"/dev/infiniband/{k}{n}" for n in numbers for k in ("uverbs", "umad", "issm")]


@pytest.fixture
def node() -> Iterator[DpNode]:
    with dp_node(bonds=4, numa=lambda i: i // 2) as d:
        yield d


def test_exclusive_names_one_cdi_device_per_bond_resolving_to_the_default_answers_nodes_and_env(
        node: DpNode, cdicheck: str) -> None:
    d = node
    spec_dir = os.path.join(d.n.tmp, "cdi")
    proc = d.start()  # today's answer first, from the same node
    ep = d.endpoint()
    ep.wait_list(lambda devs: len(devs) == 4 and all(x.health == "Healthy" for x in devs))
    plain = ep.allocate(["mlx5_bond_2", "mlx5_bond_0"], ["mlx5_bond_3"]).container_responses
    assert d.stop(proc) == 0 and not os.path.exists(spec_dir), "the default path wrote a CDI spec"

    d.start("--cdi", "--cdi-dir", spec_dir, previous=ep)
    ep = d.endpoint()
    ep.wait_list(lambda devs: len(devs) == 4 and all(x.health == "Healthy" for x in devs))
    doc = spec_doc(spec_dir)
    assert doc["kind"] == RESOURCE and doc["cdiVersion"] == "0.6.0"
    assert spec_devices(doc) == {f"mlx5_bond_{i}": node_paths(i) for i in range(4)}
    assert [n["path"] for n in doc["containerEdits"]["deviceNodes"]] == ["/dev/infiniband/rdma_cm"]
    assert "env" not in doc["containerEdits"]  # the env is per allocation: Allocate's envs carry it

    resp = ep.allocate(["mlx5_bond_2", "mlx5_bond_0"], ["mlx5_bond_3"])
    assert names(resp) == [[f"{RESOURCE}=mlx5_bond_0", f"{RESOURCE}=mlx5_bond_2"],
                           [f"{RESOURCE}=mlx5_bond_3"]]
    for got, want in zip(resp.container_responses, plain, strict=True):
        assert list(got.devices) == [] and list(got.mounts) == [] and dict(got.annotations) == {}
        assert dict(got.envs) == dict(want.envs)
        assert "NCCL_IB_GID_INDEX" in got.envs  # exclusive mode: the host's RoCE v2 index, read now
        env, devs = resolve(cdicheck, spec_dir, *(c.name for c in got.cdi_devices))
        assert env == []
        assert devs == dev_lines([(s.container_path, s.host_path) for s in want.devices])
    assert dict(resp.container_responses[0].envs)["NCCL_IB_HCA"] == "=mlx5_bond_0,mlx5_bond_2"
    wait_for(lambda: d.status()["allocations"] == 2, 5, "allocations counted")


def test_spec_follows_the_nodes_is_refused_for_an_unhealthy_bond_and_outlives_the_plugin(
        node: DpNode, cdicheck: str) -> None:
    d = node
    spec_dir = os.path.join(d.n.tmp, "cdi")
    proc = d.start("--cdi", "--cdi-dir", spec_dir)
    ep = d.endpoint()
    ep.wait_list(lambda devs: len(devs) == 4 and all(x.health == "Healthy" for x in devs))
    ib = os.path.join(d.dev, "infiniband")
    uverbs1, umad0 = os.path.join(ib, "uverbs1"), os.path.join(ib, "umad0")
    numbers = {p: os.stat(p).st_rdev for p in (uverbs1, umad0)}

    os.unlink(uverbs1)  # the health watch sees it (Unhealthy) and the spec loses the bond
    wait_for(lambda: "mlx5_bond_1" not in spec_devices(spec_doc(spec_dir)), 10, "mlx5_bond_1 out of the spec")
    with pytest.raises(grpc.RpcError) as err:
        ep.allocate(["mlx5_bond_1"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "mlx5_bond_1" in (err.value.details() or "")
    os.mknod(uverbs1, 0o666 | stat.S_IFCHR, numbers[uverbs1])
    wait_for(lambda: spec_devices(spec_doc(spec_dir)).get("mlx5_bond_1") == node_paths(1), 10,
             "mlx5_bond_1 back in the spec")

    os.unlink(umad0)  # no health change, no event: the Allocate that names the bond syncs the spec first
    resp = ep.allocate(["mlx5_bond_0"])
    kept = ("uverbs0", "issm0")
    assert spec_devices(spec_doc(spec_dir))["mlx5_bond_0"] == [f"/dev/infiniband/{n}" for n in kept]
    _, devs = resolve(cdicheck, spec_dir, *names(resp)[0])
    assert devs == dev_lines([(f"/dev/infiniband/{n}", os.path.join(ib, n)) for n in (*kept, "rdma_cm")])
    os.mknod(umad0, 0o666 | stat.S_IFCHR, numbers[umad0])

    # SIGTERM and kill -9 both leave the spec: kubelet names it again for any container it re-creates.
    path = os.path.join(spec_dir, SPEC)
    assert d.stop(proc) == 0 and os.path.exists(path)
    proc = d.start("--cdi", "--cdi-dir", spec_dir, previous=ep)
    ep = d.endpoint()
    ep.wait_list(lambda devs: len(devs) == 4)
    ep.allocate(["mlx5_bond_0"])  # umad0 is back: the spec gains it at this sync
    inode = os.stat(path).st_ino
    assert d.stop(proc, signal.SIGKILL) == -signal.SIGKILL and os.path.exists(path)
    d.start("--cdi", "--cdi-dir", spec_dir, previous=ep)
    d.endpoint().wait_list(lambda devs: len(devs) == 4)
    assert os.stat(path).st_ino == inode, "a restart over an unchanged node rewrote the spec"
    assert spec_devices(spec_doc(spec_dir)) == {f"mlx5_bond_{i}": node_paths(i) for i in range(4)}


def test_shared_mode_names_the_whole_set_for_any_virtual_id(tmp_path: Path, cdicheck: str) -> None:
    with dp_node(bonds=2) as d:
        spec_dir = os.path.join(d.n.tmp, "cdi")
        conf = os.path.join(d.n.tmp, "dp.yaml")
        with open(conf, "w") as f:
            f.write("mode: shared\nsharedCount: 10\n")
        d.start("--config", conf, "--cdi", "--cdi-dir", spec_dir)
        ep = d.endpoint()
        ep.wait_list(lambda devs: len(devs) == 10 and all(x.health == "Healthy" for x in devs))
        assert spec_devices(spec_doc(spec_dir)) == {"all": node_paths(0, 1)}
        resp = ep.allocate(["3"], ["1", "7"])
        assert names(resp) == [[f"{RESOURCE}=all"], [f"{RESOURCE}=all"]]
        for r in resp.container_responses:
            assert list(r.devices) == []
            assert dict(r.envs) == {"NCCL_IB_HCA": "=mlx5_bond_0,mlx5_bond_1",
                                    "UCX_NET_DEVICES": "mlx5_bond_0:1,mlx5_bond_1:1"}
        _, devs = resolve(cdicheck, spec_dir, f"{RESOURCE}=all")
        ib = os.path.join(d.dev, "infiniband")
        assert devs == dev_lines([(p, os.path.join(ib, os.path.basename(p)))
                                  for p in [*node_paths(0, 1), "/dev/infiniband/rdma_cm"]])
        with pytest.raises(grpc.RpcError) as err:
            ep.allocate(["10"])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_mellanox_config_json_pools_get_a_spec_each_and_resolve_together(cdicheck: str) -> None:
    second = {"resourceName": "hca_shared_devices_b", "rdmaHcaMax": 100,
              "selectors": {"vendors": ["15b3"], "linkTypes": ["ether"]}}
    with pool_node() as p:
        spec_dir = os.path.join(p.d.n.tmp, "cdi")
        p.start_with(seed002.with_second_pool(second), [POOL_A, POOL_B], "--cdi", "--cdi-dir", spec_dir)
        a, b = p.endpoint(POOL_A), p.endpoint(POOL_B)
        a.wait_list(lambda devs: len(devs) == 200)
        b.wait_list(lambda devs: len(devs) == 100)
        assert sorted(os.listdir(spec_dir)) == ["rdma-hca_shared_devices_a_rdma-device-plugin.json",
                                                "rdma-hca_shared_devices_b_rdma-device-plugin.json"]
        doc_a = spec_doc(spec_dir, "rdma-hca_shared_devices_a_rdma-device-plugin.json")
        assert doc_a["kind"] == POOL_A and spec_devices(doc_a) == {"all": node_paths(4)}
        doc_b = spec_doc(spec_dir, "rdma-hca_shared_devices_b_rdma-device-plugin.json")
        assert spec_devices(doc_b) == {"all": node_paths(0, 1, 2, 3)}
        ra, rb = a.allocate(["7"]), b.allocate(["5", "99"])
        assert names(ra) == [[f"{POOL_A}=all"]] and names(rb) == [[f"{POOL_B}=all"]]
        assert dict(ra.container_responses[0].envs) == {"NCCL_IB_HCA": "=mlx5_4",
                                                        "UCX_NET_DEVICES": "mlx5_4:1"}
        # A pod holding both pools: each spec's rdma_cm edit, once.
        _, devs = resolve(cdicheck, spec_dir, f"{POOL_A}=all", f"{POOL_B}=all")
        ib = os.path.join(p.d.dev, "infiniband")
        assert devs == dev_lines([(x, os.path.join(ib, os.path.basename(x)))
                                  for x in [*node_paths(0, 1, 2, 3, 4), "/dev/infiniband/rdma_cm"]])


POOLS = f"""
pools:
  - resourceName: {RESOURCE}
    selectors: {{linkTypes: [ether]}}
  - resourceName: rdma/ib
    mode: shared
    count: 10
    selectors: {{linkTypes: [infiniband]}}
  - resourceName: rdma/ib-too
    mode: shared
    count: 5
    selectors: {{linkTypes: [infiniband]}}
"""


def test_pools_exclusive_and_two_shared_over_the_same_hcas_do_not_conflict(cdicheck: str) -> None:
    with pool_node() as p:
        spec_dir = os.path.join(p.d.n.tmp, "cdi")
        p.start_with(POOLS, [RESOURCE, "rdma/ib", "rdma/ib-too"], "--cdi", "--cdi-dir", spec_dir)
        ex, ib, too = p.endpoint(RESOURCE), p.endpoint("rdma/ib"), p.endpoint("rdma/ib-too")
        ex.wait_list(lambda devs: len(devs) == 4)
        ib.wait_list(lambda devs: len(devs) == 10)
        too.wait_list(lambda devs: len(devs) == 5)
        assert spec_devices(spec_doc(spec_dir)) == {h: node_paths(i) for i, h in enumerate(ROCE)}
        assert names(ex.allocate(["mlx5_bond_3"])) == [[f"{RESOURCE}=mlx5_bond_3"]]
        ids = [*names(ib.allocate(["0"]))[0], *names(too.allocate(["4"]))[0]]
        assert ids == ["rdma/ib=all", "rdma/ib-too=all"]
        _, devs = resolve(cdicheck, spec_dir, f"{RESOURCE}=mlx5_bond_3", *ids)  # no "conflicting device"
        ib_dir = os.path.join(p.d.dev, "infiniband")
        assert devs == dev_lines([(x, os.path.join(ib_dir, os.path.basename(x)))
                                  for x in [*node_paths(3, 4, 5), "/dev/infiniband/rdma_cm"]])


def test_start_removes_a_dropped_pools_spec_only_when_no_pod_holds_it() -> None:
    from podresources_server import PodResourcesServer

    pr = PodResourcesServer("")
    with dp_node(bonds=2, pod_resources=pr.add_to) as d:
        spec_dir = os.path.join(d.n.tmp, "cdi")
        os.makedirs(spec_dir)
        left = {"rdma-old_rdma-device-plugin.json": "rdma/old",
                "rdma-held_rdma-device-plugin.json": "rdma/held",
                "rdma.tke.cloud.tencent.com-bond_0b7e.json": "rdma.tke.cloud.tencent.com/bond"}
        for name, kind in left.items():
            with open(os.path.join(spec_dir, name), "w") as f:
                json.dump({"cdiVersion": "0.6.0", "kind": kind, "devices": []}, f)
        pr.set_pod("default", "still-running", {"c": {"rdma/held": ["3"]}})
        d.start("--cdi", "--cdi-dir", spec_dir)
        d.endpoint().wait_list(lambda devs: len(devs) == 2)
        assert sorted(os.listdir(spec_dir)) == ["rdma-held_rdma-device-plugin.json",
                                                "rdma.tke.cloud.tencent.com-bond_0b7e.json", SPEC]
        log = d.log_text()
        assert "rdma-old_rdma-device-plugin.json of a pool no longer configured removed" in log
        assert "pool rdma/held (no longer configured) kept: a pod holds that resource" in log


def _run_plugin(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "rdma_cni.cli.device_plugin", "--cni-conf", "/nonexistent/x.conf",
            "--log-file", "", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))


@pytest.mark.parametrize(("args", "words"), [
    (["--cdi-dir", "/tmp/x"], ["--cdi-dir", "only with --cdi"]),
    (["--cdi", "--cdi-dir", "run/cdi"], ["--cdi-dir", "absolute"]),
    (["--cdi", "--resource-name", "rdma.tke.cloud.tencent.com/bond"], ["DRA driver", "without --cdi"]),
    (["--cdi", "--resource-name", "example.com/1x"], ["class '1x'", "start with a letter"]),
])
def test_bad_cdi_flags_are_one_sentence_and_exit_2(args: list[str], words: list[str]) -> None:
    out = _run_plugin(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), out.stderr


def test_a_spec_dir_that_is_a_file_and_two_pools_of_one_file_are_refused(tmp_path: Path) -> None:
    afile = tmp_path / "cdi"
    afile.write_text("")
    out = _run_plugin("--cdi", "--cdi-dir", str(afile))
    assert out.returncode == 2 and "not a directory" in out.stderr, out.stderr
    conf = tmp_path / "dp.yaml"
    # <vendor>-<class>: both are a-b.example-c_rdma-device-plugin.json
    conf.write_text("pools:\n  - resourceName: a-b.example/c\n  - resourceName: a/b.example-c\n")
    out = _run_plugin("--config", str(conf), "--cdi", "--cdi-dir", str(tmp_path / "specs"))
    assert out.returncode == 2 and "spec file would be pool a-b.example/c's" in out.stderr, out.stderr
    assert not (tmp_path / "specs").exists()
