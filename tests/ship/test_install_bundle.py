"""scripts/build's onedir bundle (``tests/install_support.py``) and its programs run without
Python: its shape, the command names, builds without the C client or a C compiler, the installed
plugins and cni-tool, a noexec /tmp, the frozen device plugin against the test kubelet, the frozen
rdma-ipvlan, and the whole demo on the installed bundle.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import install_support
import pytest
from install_support import NAMES, PLUGINS, PREFIX, REPO, ask_version, bare_env, installed, need, run

# scripts/build's bundle, built once per run (tests/install_support.py).
bundle = install_support.bundle


def test_bundle_is_onedir_with_the_three_names(bundle: Path) -> None:
    exe = bundle / "rdma-cni"
    assert exe.is_file() and os.access(exe, os.X_OK)
    assert (bundle / "_internal").is_dir(), "not onedir"
    # The plugins start with rdma-agent's C thin client (scripts/build's default), which execs
    # rdma-cni beside it when no agent answers; the other commands are the bundle itself.
    assert os.readlink(bundle / "cni-tool") == os.readlink(bundle / "rdma-agent") == "rdma-cni"
    for name in PLUGINS:
        assert os.readlink(bundle / name) == "rdma-cni-client"
    client = bundle / "rdma-cni-client"
    assert client.is_file() and os.access(client, os.X_OK)
    # Static: it runs on a node whatever its C library, and resolves nothing at exec.
    assert "INTERP" not in run(["readelf", "-l", str(client)]).stdout
    assert (bundle / "install.sh").is_file() and (bundle / "conf" / "vpc-cni").is_dir()
    # Development tools that optional imports drag in (IPython -> jedi; pydantic's mypy plugin) stay
    # out: they were 45 MB of the bundle.
    for unwanted in ("jedi", "mypy", "IPython", "numpy"):
        assert not (bundle / "_internal" / unwanted).exists(), unwanted
    # Stripped: no debug sections in the interpreter library (onefile's extraction cost came from them).
    libpython = next((bundle / "_internal").glob("libpython3*.so*"))
    sections = run(["readelf", "-S", str(libpython)]).stdout
    assert ".debug_info" not in sections


def test_bundle_refuses_an_unknown_name_clearly(bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "rdma-whatever").symlink_to(bundle / "rdma-cni")
    proc = run([str(tmp_path / "rdma-whatever")], env=bare_env(tmp_path))
    assert proc.returncode == 2
    assert "rdma-macvlan" in proc.stderr and proc.stdout == ""


def test_bundle_runs_a_command_named_as_its_first_argument(bundle: Path, tmp_path: Path) -> None:
    proc = run([str(bundle / "rdma-cni"), "cni-tool", "--help"], env=bare_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "doctor" in proc.stdout and "state" in proc.stdout and "gids" in proc.stdout


def test_build_without_a_c_compiler_stops_before_freezing(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    proc = run(
        [str(REPO / "scripts" / "build"), "--out", str(out)], env={**os.environ, "CC": "/nonexistent/cc"}
    )
    assert proc.returncode == 1
    assert "--without-client" in proc.stderr and "PyInstaller" not in proc.stderr
    assert not (out / "rdma-cni").exists()


@pytest.mark.slow
def test_build_without_client_links_the_plugins_to_the_bundle(tmp_path: Path) -> None:
    """--without-client: no C client; the plugins are the bundle (which asks the agent itself)."""
    out = tmp_path / "dist"
    proc = run([str(REPO / "scripts" / "build"), "--out", str(out), "--without-client"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    bundle = out / "rdma-cni"
    assert not (bundle / "rdma-cni-client").exists()
    for name in (*NAMES, "rdma-agent"):
        assert os.readlink(bundle / name) == "rdma-cni", name
    version = ask_version(bundle, "rdma-macvlan", bare_env(tmp_path, CNI_COMMAND="VERSION"))
    assert version.returncode == 0 and "supportedVersions" in version.stdout, version.stderr


# ---- running the installed binaries without Python ---------------------------------------------


@pytest.mark.parametrize("name", ["rdma-macvlan", "rdma-multus"])
def test_installed_plugin_answers_version_without_python(bundle: Path, tmp_path: Path, name: str) -> None:
    need({"rdma-macvlan": "macvlan", "rdma-multus": "multus"}[name])
    bin_dir = installed(bundle, tmp_path)
    env = bare_env(tmp_path, CNI_COMMAND="VERSION")
    proc = run([str(bin_dir / name)], env=env, input='{"cniVersion":"1.0.0"}')
    assert proc.returncode == 0, proc.stderr
    versions = json.loads(proc.stdout)["supportedVersions"]
    assert {"0.3.1", "0.4.0", "1.0.0", "1.1.0"} <= set(versions)


def test_installed_cni_tool_runs_without_python(bundle: Path, tmp_path: Path) -> None:
    need("tool")
    bin_dir = installed(bundle, tmp_path)
    proc = run([str(bin_dir / "cni-tool"), "--help"], env=bare_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "gids" in proc.stdout or "add" in proc.stdout


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A dir not under /tmp, so a noexec tmpfs mounted over /tmp does not hide the install."""
    d = Path("/var/tmp") / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_noexec_tmp_does_not_matter(bundle: Path, outside_tmp: Path) -> None:
    need("macvlan")
    bin_dir = installed(bundle, outside_tmp)
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) missing")
    # A private mount namespace with a noexec, empty /tmp: a onefile binary fails here (it unpacks and
    # runs from $TMPDIR); the onedir bundle must not care.
    script = (
        "mount -t tmpfs -o noexec,nosuid,nodev tmpfs /tmp && "
        "grep ' /tmp ' /proc/self/mounts | grep -q noexec && "
        f'echo \'{{"cniVersion":"1.0.0"}}\' | CNI_COMMAND=VERSION TMPDIR=/tmp {bin_dir}/rdma-macvlan'
    )
    proc = run(["unshare", "-m", "sh", "-c", script], env=bare_env(outside_tmp) | {"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "supportedVersions" in proc.stdout


def test_bundled_device_plugin_registers_with_a_kubelet_without_python(bundle: Path, tmp_path: Path) -> None:
    """rdma-device-plugin of the bundle (grpcio, protobuf and the generated stubs frozen in) serves,
    registers with the test kubelet over real gRPC, lists its device and removes its socket on
    SIGTERM. It runs in this netns, where no bond0 exists: the device is listed Unhealthy."""
    import signal

    from rdma_cni.sim.kubelet import TestKubelet
    from rdma_cni.sim.tree import SimBond, build_tree

    assert os.readlink(bundle / "rdma-device-plugin") == "rdma-cni"
    sysfs = build_tree(str(tmp_path / "sys"), [SimBond("bond0", "mlx5_bond_0")], gid_slots=8)
    (tmp_path / "dev").mkdir()
    conf = tmp_path / "tke-rdma-macvlan.conf"
    conf.write_text(json.dumps({"cniVersion": "1.0.0", "name": "tke-rdma-macvlan", "type": "rdma-macvlan",
                                "masters": ["bond0"], "dataDir": str(tmp_path / "state")}))
    short = Path(tempfile.mkdtemp(prefix="h11g-"))  # unix socket paths: at most 107 bytes
    with TestKubelet(short / "kubelet") as kubelet, contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, short, True)
        proc = subprocess.Popen(
            [str(bundle / "rdma-device-plugin"), "--kubelet-root-dir", kubelet.root, "--sysfs-root", sysfs,
             "--dev-root", str(tmp_path / "dev"), "--cni-conf", str(conf), "--run-dir", str(tmp_path / "run"),
             "--log-file", "", "--device-info-dir", str(tmp_path / "devinfo")],
            env=bare_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            ep = kubelet.wait_endpoint("tke.cloud.tencent.com/tke-shared-rdma", timeout=60)
            _, devs = ep.wait_list(lambda devs: len(devs) == 1)
            assert devs[0].id == "mlx5_bond_0" and devs[0].health == "Unhealthy"
            assert os.path.exists(os.path.join(kubelet.dir, ep.endpoint))
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert out == b""  # logs go to stderr, never stdout
        assert not os.path.exists(os.path.join(kubelet.dir, ep.endpoint))


def test_bundled_device_plugin_serves_seed_002s_mellanox_pool(bundle: Path, tmp_path: Path) -> None:
    """The bundle's rdma-device-plugin with seed 002's own config.json (tests/seed002.py) registers the
    Mellanox pool rdma/hca_shared_devices_a with its 200 devices over real gRPC, on an InfiniBand HCA
    whose IPoIB netdev ibs108 does not exist in this netns: listed, Unhealthy."""
    import signal

    import seed002

    from rdma_cni.sim.kubelet import TestKubelet
    from rdma_cni.sim.tree import SimIbHca, add_ib_hca, build_tree

    sysfs = build_tree(str(tmp_path / "sys"), [], gid_slots=8)
    add_ib_hca(sysfs, SimIbHca("mlx5_0", "ibs108", pci_index=0, uverbs=0, numa_node=1))
    (tmp_path / "dev").mkdir()
    config = tmp_path / "config.json"
    config.write_text(seed002.config_text())
    short = Path(tempfile.mkdtemp(prefix="h11p-"))
    with TestKubelet(short / "kubelet") as kubelet, contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, short, True)
        proc = subprocess.Popen(
            [str(bundle / "rdma-device-plugin"), "--config", str(config), "--kubelet-root-dir", kubelet.root,
             "--sysfs-root", sysfs, "--dev-root", str(tmp_path / "dev"),
             "--cni-conf", str(tmp_path / "none.conf"), "--run-dir", str(tmp_path / "run"), "--log-file", "",
             "--device-info-dir", str(tmp_path / "devinfo")],
            env=bare_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            ep = kubelet.wait_endpoint("rdma/hca_shared_devices_a", timeout=60)
            _, devs = ep.wait_list(lambda devs: len(devs) == 200)
            assert {(d.health, d.numa) for d in devs} == {("Unhealthy", (1,))}
            assert ep.endpoint.startswith("hca_shared_devices_a-")
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert out == b""
        assert "ibs108 of mlx5_0 is missing" in err.decode()


def test_bundle_ships_rdma_ipvlan_frozen_with_its_config_model(bundle: Path, tmp_path: Path) -> None:
    """rdma-ipvlan (shared mode) is a plugin of the bundle like rdma-macvlan: the thin client's
    name, installed into the CNI bin dir, answering VERSION and refusing a bad config with its
    own error 7 (so its pydantic model is frozen in)."""
    assert os.readlink(bundle / "rdma-ipvlan") == "rdma-cni-client"
    bin_dir = installed(bundle, tmp_path / "root")
    assert os.readlink(bin_dir / "rdma-ipvlan") == "rdma-cni.d/current/rdma-ipvlan"
    env = bare_env(tmp_path, CNI_COMMAND="VERSION")
    proc = ask_version(bin_dir, "rdma-ipvlan", env)
    assert proc.returncode == 0 and "1.1.0" in json.loads(proc.stdout)["supportedVersions"], proc.stderr
    conf = {"cniVersion": "1.1.0", "name": "tke-rdma-ipvlan", "type": "rdma-ipvlan", "link": "vxlan",
            "logFile": ""}
    env = bare_env(tmp_path, CNI_COMMAND="STATUS", CNI_PATH=str(bin_dir))
    proc = run([str(bin_dir / "rdma-ipvlan")], env=env, input=json.dumps(conf))
    answer = json.loads(proc.stdout)
    assert proc.returncode == 1 and answer["code"] == 7 and "'link'" in answer["msg"], proc.stdout


def test_demo_runs_on_the_installed_bundle(bundle: Path) -> None:
    """The whole demo (rdma-multus -> ptp + rdma-macvlan, gids, doctor, state, DEL) on the frozen binaries."""
    if os.geteuid() != 0 or not os.access("/usr/lib/cni/ptp", os.X_OK):
        pytest.skip("needs root and the reference CNI plugins")
    proc = run([str(REPO / "scripts" / "demo"), "--bundle", str(bundle)], cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"install.sh --bundle {bundle}" in proc.stdout
    assert "0 warnings, 0 failures" in proc.stdout and "demo OK" in proc.stdout
