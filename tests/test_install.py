"""The shipped artifact: scripts/build's onedir bundle and scripts/install.sh.

The bundle is built once per test run (PyInstaller, ~10-60 s; shared by the test workers) and
installed into temporary directories; every check runs the installed binaries with no Python
reachable (PATH holds only `ip`), so a node without Python is what is tested.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from shared_builds import built_once

REPO = Path(__file__).resolve().parent.parent
NAMES = ("rdma-macvlan", "rdma-multus", "cni-tool")
PLUGINS = ("rdma-macvlan", "rdma-multus")
PREFIX = "h10-"


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc: subprocess.CompletedProcess[str] = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, check=False, **kw
    )
    return proc


@pytest.fixture(scope="session")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/rdma-cni as scripts/build makes it, built into a temp dir (never the repo's dist/), once
    per run for all test workers (tests/shared_builds.py)."""

    def build(out: Path) -> None:
        proc = _run([str(REPO / "scripts" / "build"), "--out", str(out)])
        assert proc.returncode == 0, proc.stderr[-3000:]

    return built_once(tmp_path_factory, "h6-dist", build) / "rdma-cni"


def no_python_path(base: Path) -> str:
    """A PATH with `ip` and nothing else: the plugins must not need an interpreter."""
    d = base / "path"
    d.mkdir(exist_ok=True)
    for tool in ("ip",):
        found = shutil.which(tool)
        if found and not (d / tool).exists():
            (d / tool).symlink_to(found)
    assert shutil.which("python3", path=str(d)) is None and shutil.which("python", path=str(d)) is None
    return str(d)


def bare_env(base: Path, **extra: str) -> dict[str, str]:
    """No Python, and no rdma-agent either: the thin client must find no socket, so the bundle itself
    answers (an agent on this machine's default socket would otherwise serve the call)."""
    return {"PATH": no_python_path(base), "RDMA_CNI_AGENT_SOCKET": str(base / "no-agent.sock"), **extra}


def install(bundle: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(bundle / "install.sh"), "--bundle", str(bundle), "--host-root", str(root), *args]
    return _run(cmd)


def _walk(root: Path, file_key: Callable[[Path], str]) -> dict[str, tuple[str, str]]:
    """Everything under root: path -> (kind, link target or ``file_key`` of a file)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", file_key(p))
        else:
            out[rel] = ("dir", "")
    return out


def _tree(root: Path) -> dict[str, tuple[str, str]]:
    """Everything install.sh put under root: path -> (kind, link target or mtime and size)."""
    return _walk(root, lambda p: f"{p.stat().st_mtime_ns}:{p.stat().st_size}")


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
    assert "INTERP" not in _run(["readelf", "-l", str(client)]).stdout
    assert (bundle / "install.sh").is_file() and (bundle / "conf" / "vpc-cni").is_dir()
    # Development tools that optional imports drag in (IPython -> jedi; pydantic's mypy plugin) stay
    # out: they were 45 MB of the bundle.
    for unwanted in ("jedi", "mypy", "IPython", "numpy"):
        assert not (bundle / "_internal" / unwanted).exists(), unwanted
    # Stripped: no debug sections in the interpreter library (onefile's extraction cost came from them).
    libpython = next((bundle / "_internal").glob("libpython3*.so*"))
    sections = _run(["readelf", "-S", str(libpython)]).stdout
    assert ".debug_info" not in sections


def test_bundle_refuses_an_unknown_name_clearly(bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "rdma-whatever").symlink_to(bundle / "rdma-cni")
    proc = _run([str(tmp_path / "rdma-whatever")], env=bare_env(tmp_path))
    assert proc.returncode == 2
    assert "rdma-macvlan" in proc.stderr and proc.stdout == ""


def test_bundle_runs_a_command_named_as_its_first_argument(bundle: Path, tmp_path: Path) -> None:
    proc = _run([str(bundle / "rdma-cni"), "cni-tool", "--help"], env=bare_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "doctor" in proc.stdout and "state" in proc.stdout and "gids" in proc.stdout


def test_install_layout_configs_and_node_paths(bundle: Path, tmp_path: Path) -> None:
    proc = install(bundle, tmp_path, "--mode", "vpc-cni", "--conf-dir", "/etc/cni/net.d")
    assert proc.returncode == 0, proc.stderr
    build_id = (bundle / "BUILD_ID").read_text().strip()
    bin_dir = tmp_path / "opt/cni/bin"
    assert os.readlink(bin_dir / "rdma-cni.d/current") == build_id
    for name in NAMES:
        assert os.readlink(bin_dir / name) == f"rdma-cni.d/current/{name}"
        assert os.access(bin_dir / name, os.X_OK)
    meta = json.loads((tmp_path / "etc/cni/net.d/00-rdma-multus.conflist").read_text())
    assert meta["plugins"][0]["defaultDelegates"] == "tke-route-eni"
    # Configs name node paths, not the installer's view of them (--host-root).
    assert meta["plugins"][0]["confDir"] == "/etc/cni/net.d/rdma-multus.d"
    delegate = json.loads((tmp_path / "etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf").read_text())
    assert delegate["type"] == "rdma-macvlan"


def test_install_rewrites_paths_for_custom_dirs(bundle: Path, tmp_path: Path) -> None:
    proc = install(
        bundle,
        tmp_path,
        "--mode",
        "global-router",
        "--conf-dir",
        "/etc/cni/custom.d",
        "--cni-bin-dir",
        "/usr/libexec/cni",
        "--kubelet-root-dir",
        "/data/kubelet",
    )
    assert proc.returncode == 0, proc.stderr
    plugin = json.loads((tmp_path / "etc/cni/custom.d/00-rdma-multus.conflist").read_text())["plugins"][0]
    assert plugin["defaultDelegates"] == "tke-bridge"
    assert plugin["confDir"] == "/etc/cni/custom.d/rdma-multus.d"
    assert plugin["kubeconfig"] == "/etc/cni/custom.d/rdma-multus.d/rdma-multus.kubeconfig"
    assert plugin["kubeletRootDir"] == "/data/kubelet"  # pod-resources/ follows kubelet's --root-dir,
    assert plugin["devicePluginDir"] == "/var/lib/kubelet/device-plugins"  # device-plugins/ never moves
    assert (tmp_path / "usr/libexec/cni/rdma-macvlan").is_symlink()


def test_install_is_idempotent(bundle: Path, tmp_path: Path) -> None:
    assert install(bundle, tmp_path, "--mode", "vpc-cni").returncode == 0
    before = _tree(tmp_path)
    proc = install(bundle, tmp_path, "--mode", "vpc-cni")
    assert proc.returncode == 0
    assert _tree(tmp_path) == before, "a second install changed files"
    assert "wrote" not in proc.stderr and "linked" not in proc.stderr


def test_switching_mode_replaces_the_meta_config(bundle: Path, tmp_path: Path) -> None:
    assert install(bundle, tmp_path, "--mode", "vpc-cni").returncode == 0
    assert install(bundle, tmp_path, "--mode", "global-router").returncode == 0
    confs = sorted(p.name for p in (tmp_path / "etc/cni/net.d").glob("*.conflist"))
    assert confs == ["00-rdma-multus.conflist"]
    meta = json.loads((tmp_path / "etc/cni/net.d/00-rdma-multus.conflist").read_text())
    assert meta["plugins"][0]["defaultDelegates"] == "tke-bridge"


def test_without_mode_the_default_network_is_untouched(bundle: Path, tmp_path: Path) -> None:
    proc = install(bundle, tmp_path)
    assert proc.returncode == 0
    assert not (tmp_path / "etc/cni/net.d/00-rdma-multus.conflist").exists()
    assert (tmp_path / "etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf").is_file()
    assert "default network is unchanged" in proc.stderr


def test_bad_arguments_change_nothing(bundle: Path, tmp_path: Path) -> None:
    for args in (["--mode", "calico"], ["--conf-dir", "relative/dir"], ["--cni-bin-dir", "/a b"], ["--x"]):
        proc = install(bundle, tmp_path, *args)
        assert proc.returncode != 0 and "install.sh:" in proc.stderr, args
    assert list(tmp_path.iterdir()) == []


def _fake_build(bundle: Path, dest: Path, build_id: str) -> Path:
    """The same bundle under another BUILD_ID: an upgrade as install.sh sees it."""
    shutil.copytree(bundle, dest, symlinks=True)
    (dest / "BUILD_ID").write_text(build_id + "\n")
    return dest


def test_upgrade_keeps_one_previous_version_and_uninstall_removes_everything(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    builds = [_fake_build(bundle, tmp_path / f"b{i}", f"0.1.0-test{i}") for i in range(3)]
    for b in builds:
        assert install(b, root, "--mode", "vpc-cni").returncode == 0
    lib = root / "opt/cni/bin/rdma-cni.d"
    assert sorted(p.name for p in lib.iterdir()) == ["0.1.0-test1", "0.1.0-test2", "current"]
    assert os.readlink(lib / "current") == "0.1.0-test2"
    # Someone else's plugin in the same bin dir is never touched.
    (root / "opt/cni/bin/macvlan").write_text("#!/bin/sh\n")
    proc = _run([str(bundle / "install.sh"), "--host-root", str(root), "--uninstall"])
    assert proc.returncode == 0, proc.stderr
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert left == ["opt/cni/bin/macvlan"]


def test_uninstall_refuses_while_pods_hold_bonds(bundle: Path, tmp_path: Path) -> None:
    assert install(bundle, tmp_path, "--mode", "vpc-cni").returncode == 0
    state = tmp_path / "var/lib/cni/rdma-macvlan"
    state.mkdir(parents=True)
    (state / "attachment.json").write_text("{}")
    proc = _run([str(bundle / "install.sh"), "--host-root", str(tmp_path), "--uninstall"])
    assert proc.returncode != 0 and "DEL needs rdma-macvlan" in proc.stderr
    assert (tmp_path / "opt/cni/bin/rdma-macvlan").is_symlink()
    proc = _run([str(bundle / "install.sh"), "--host-root", str(tmp_path), "--uninstall", "--force"])
    assert proc.returncode == 0
    assert not (tmp_path / "opt/cni/bin/rdma-macvlan").exists()


def test_a_reader_never_sees_a_half_installed_bundle_or_config(bundle: Path, tmp_path: Path) -> None:
    """Upgrades and mode switches in a loop while a reader checks, each with one syscall, what a pod
    start would open: the plugin binary behind the link, the bundle behind `current`, the configs."""
    root = tmp_path / "root"
    builds = [_fake_build(bundle, tmp_path / f"b{i}", f"0.1.0-race{i}") for i in range(4)]
    assert install(builds[0], root, "--mode", "vpc-cni").returncode == 0
    bin_dir = root / "opt/cni/bin"
    meta = root / "etc/cni/net.d/00-rdma-multus.conflist"
    delegate = root / "etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf"
    problems: list[str] = []
    done = threading.Event()
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not done.is_set():
            try:
                for name in NAMES:
                    st = os.stat(bin_dir / name)  # follows both links in one call
                    assert st.st_size > 0 and st.st_mode & 0o111
                build_id = (bin_dir / "rdma-cni.d/current/BUILD_ID").read_text()
                assert build_id.startswith("0.1.0-race"), build_id
                assert (bin_dir / "rdma-cni.d/current/_internal/base_library.zip").stat().st_size > 0
                json.loads(meta.read_text())
                json.loads(delegate.read_text())
                reads += 1
            except (OSError, AssertionError, ValueError) as exc:
                problems.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i, b in enumerate(builds[1:] + builds[:2]):
            mode = "global-router" if i % 2 else "vpc-cni"
            proc = install(b, root, "--mode", mode)
            assert proc.returncode == 0, proc.stderr
    finally:
        done.set()
        thread.join()
    assert problems == []
    assert reads > 10


# ---- running the installed binaries without Python ---------------------------------------------


def _installed(bundle: Path, root: Path) -> Path:
    assert install(bundle, root, "--mode", "vpc-cni").returncode == 0
    return root / "opt/cni/bin"


def _need(module: str) -> None:
    if not (REPO / "rdma_cni" / "cli" / f"{module}.py").exists():
        pytest.skip(f"rdma_cni/cli/{module}.py has not landed yet")


@pytest.mark.parametrize("name", ["rdma-macvlan", "rdma-multus"])
def test_installed_plugin_answers_version_without_python(bundle: Path, tmp_path: Path, name: str) -> None:
    _need({"rdma-macvlan": "macvlan", "rdma-multus": "multus"}[name])
    bin_dir = _installed(bundle, tmp_path)
    env = bare_env(tmp_path, CNI_COMMAND="VERSION")
    proc = _run([str(bin_dir / name)], env=env, input='{"cniVersion":"1.0.0"}')
    assert proc.returncode == 0, proc.stderr
    versions = json.loads(proc.stdout)["supportedVersions"]
    assert {"0.3.1", "0.4.0", "1.0.0", "1.1.0"} <= set(versions)


def test_installed_cni_tool_runs_without_python(bundle: Path, tmp_path: Path) -> None:
    _need("tool")
    bin_dir = _installed(bundle, tmp_path)
    proc = _run([str(bin_dir / "cni-tool"), "--help"], env=bare_env(tmp_path))
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
    _need("macvlan")
    bin_dir = _installed(bundle, outside_tmp)
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) missing")
    # A private mount namespace with a noexec, empty /tmp: a onefile binary fails here (it unpacks and
    # runs from $TMPDIR); the onedir bundle must not care.
    script = (
        "mount -t tmpfs -o noexec,nosuid,nodev tmpfs /tmp && "
        "grep ' /tmp ' /proc/self/mounts | grep -q noexec && "
        f'echo \'{{"cniVersion":"1.0.0"}}\' | CNI_COMMAND=VERSION TMPDIR=/tmp {bin_dir}/rdma-macvlan'
    )
    proc = _run(["unshare", "-m", "sh", "-c", script], env=bare_env(outside_tmp) | {"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "supportedVersions" in proc.stdout


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """H2's node/switch netns pair (tests/netns.py), named with this file's prefix."""
    import netns

    reason = netns.can_run()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(netns, "PREFIX", PREFIX)
    with netns.node() as n:
        yield n


def _plugin(
    bin_dir: Path,
    n: Any,
    command: str,
    conf: dict[str, Any],
    pod: Any,
    path: str,
    extra_env: dict[str, str] | None = None,
) -> Any:
    """The installed rdma-macvlan run in the node netns like a runtime would, with no Python on PATH."""
    import netns

    env = {
        "PATH": path,
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "ship1",
        "CNI_NETNS": pod.path if pod else "",
        "CNI_IFNAME": "net1",
        "CNI_PATH": str(bin_dir),
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p",
        "RDMA_CNI_AGENT_SOCKET": str(Path(path) / "no-agent.sock"),
        **(extra_env or {}),
    }
    ip = shutil.which("ip")
    assert ip is not None
    proc = subprocess.run(
        [ip, "netns", "exec", n.name, str(bin_dir / "rdma-macvlan")],
        input=json.dumps(conf).encode(),
        capture_output=True,
        timeout=120,
        env=env,
        check=False,
    )
    return netns._result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


@pytest.mark.parametrize("served_by", ["bundle", "agent"])
def test_add_check_del_through_the_installed_bundle_without_python(
    bundle: Path, node: Any, tmp_path: Path, served_by: str
) -> None:
    """ADD/CHECK/DEL of the installed rdma-macvlan (the C client): with no agent the bundle runs them;
    with the installed rdma-agent running, the agent does, and a fallback would fail the call."""
    _need("macvlan")
    bin_dir = _installed(bundle, tmp_path / "root")
    path = no_python_path(tmp_path)
    with contextlib.ExitStack() as stack:
        extra: dict[str, str] = {}
        if served_by == "agent":
            sock, log, agent = stack.enter_context(_running_agent(bin_dir, tmp_path))
            extra = {"RDMA_CNI_AGENT_SOCKET": str(sock), "RDMA_CNI_FALLBACK": "/bin/false"}
        _add_check_del(bin_dir, node, path, extra)
        if served_by == "agent":
            # The worker logs after it has answered: wait for the line, it cannot be missing for good.
            _wait_for(
                lambda: all(
                    f"served rdma-macvlan {verb} ship1/net1: exit 0" in log.read_text()
                    for verb in ("ADD", "CHECK", "DEL")
                ),
                "ADD, CHECK and DEL in the agent's log",
                agent,
            )


def _add_check_del(bin_dir: Path, node: Any, path: str, extra: dict[str, str]) -> None:
    node.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
    node.bond("bond1", "198.51.100.18/28", peer="198.51.100.17/28")
    before = node.snapshot()
    pod = node.pod()
    conf = json.loads((REPO / "conf/vpc-cni/rdma-multus.d/tke-rdma-macvlan.conf").read_text())
    conf.update(node.config(masters=["bond0", "bond1"], count=2))
    add = _plugin(bin_dir, node, "ADD", conf, pod, path, extra)
    assert add.code == 0, add.stdout + add.stderr
    assert sorted(i["name"] for i in add.out["interfaces"]) == ["bond0", "bond1"]
    assert {
        a["ifname"]: [x["local"] for x in a["addr_info"] if x["family"] == "inet"]
        for a in node.pod_json(pod, "addr")
        if a["ifname"] != "lo"
    } == {"bond0": ["198.51.100.2"], "bond1": ["198.51.100.18"]}
    assert node.ping(pod, "198.51.100.1", "bond0") and node.ping(pod, "198.51.100.17", "bond1")
    check = _plugin(bin_dir, node, "CHECK", {**conf, "prevResult": add.out}, pod, path, extra)
    assert check.code == 0, check.stdout + check.stderr
    delete = _plugin(bin_dir, node, "DEL", {**conf, "prevResult": add.out}, pod, path, extra)
    assert delete.code == 0, delete.stdout + delete.stderr
    assert node.snapshot() == before


def test_kubeconfig_from_the_service_account_is_what_rdma_multus_reads(bundle: Path, tmp_path: Path) -> None:
    from rdma_cni.kube.kubeconfig import load

    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("tok-123\n")
    (sa / "ca.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    env = {
        "PATH": os.environ["PATH"],
        "RDMA_CNI_SERVICEACCOUNT_DIR": str(sa),
        "KUBERNETES_SERVICE_HOST": "fd00::1",
        "KUBERNETES_SERVICE_PORT": "6443",
    }
    root = tmp_path / "root"
    cmd = [
        str(bundle / "install.sh"),
        "--bundle",
        str(bundle),
        "--host-root",
        str(root),
        "--mode",
        "vpc-cni",
        "--kubeconfig-from-serviceaccount",
    ]
    proc = _run(cmd, env=env)
    assert proc.returncode == 0, proc.stderr
    path = root / "etc/cni/net.d/rdma-multus.d/rdma-multus.kubeconfig"
    assert path.stat().st_mode & 0o777 == 0o600
    cfg = load(str(path))
    assert cfg.server == "https://[fd00::1]:6443"
    assert cfg.bearer_token() == "tok-123"
    assert cfg.ca_data is not None and cfg.ca_data.startswith(b"-----BEGIN CERTIFICATE-----")
    meta = json.loads((root / "etc/cni/net.d/00-rdma-multus.conflist").read_text())
    assert meta["plugins"][0]["kubeconfig"] == "/etc/cni/net.d/rdma-multus.d/rdma-multus.kubeconfig"
    # A rotated token is picked up by the next run (the DaemonSet re-runs install.sh every 10 minutes).
    (sa / "token").write_text("tok-456\n")
    assert _run(cmd, env=env).returncode == 0
    assert load(str(path)).bearer_token() == "tok-456"
    missing = _run(cmd, env={**env, "RDMA_CNI_SERVICEACCOUNT_DIR": str(tmp_path / "none")})
    assert missing.returncode != 0 and "service account" in missing.stderr


def test_demo_runs_on_the_installed_bundle(bundle: Path) -> None:
    """The whole demo (rdma-multus -> ptp + rdma-macvlan, gids, doctor, state, DEL) on the frozen binaries."""
    if os.geteuid() != 0 or not os.access("/usr/lib/cni/ptp", os.X_OK):
        pytest.skip("needs root and the reference CNI plugins")
    proc = _run([str(REPO / "scripts" / "demo"), "--bundle", str(bundle)], cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"install.sh --bundle {bundle}" in proc.stdout
    assert "0 warnings, 0 failures" in proc.stdout and "demo OK" in proc.stdout


def _daemonset_commands(rdma_mode: str | None = None) -> list[list[str]]:
    """The install commands of conf/k8s/rdma-cni.yaml: the init container's, and the refresh loop's body
    (RDMA_MODE set to ``rdma_mode`` when given, as a user switches it)."""
    yaml = pytest.importorskip("yaml")
    docs = list(yaml.safe_load_all((REPO / "conf/k8s/rdma-cni.yaml").read_text()))
    pod = next(d for d in docs if d and d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    env = {e["name"]: e["value"] for e in init["env"]}
    refresh_env = {e["name"]: e["value"] for e in pod["containers"][-1]["env"]}
    assert env["RDMA_MODE"] == refresh_env["RDMA_MODE"] == "exclusive"  # the shipped default
    if rdma_mode is not None:
        env["RDMA_MODE"] = rdma_mode
    first = [init["command"][0]] + [
        a.replace("$(CLUSTER_MODE)", env["CLUSTER_MODE"])
        .replace("$(KUBELET_ROOT_DIR)", env["KUBELET_ROOT_DIR"])
        .replace("$(RDMA_MODE)", env["RDMA_MODE"])
        for a in init["args"]
    ]
    loop = next(c for c in pod["containers"] if c["name"] == "refresh")["args"][0]
    body = loop[loop.index("/opt/rdma-cni/install.sh") :].split("\ndone")[0]
    second = [w.strip('"') for w in body.replace("\\\n", " ").split()]
    second = [env[w[1:]] if w in ("$CLUSTER_MODE", "$KUBELET_ROOT_DIR", "$RDMA_MODE") else w for w in second]
    return [first, second]


def _run_daemonset_installs(bundle: Path, tmp_path: Path, rdma_mode: str | None = None) -> Path:
    """Both install commands of the DaemonSet, run into tmp_path/host; returns that host root."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t\n")
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    env = {
        "PATH": os.environ["PATH"],
        "RDMA_CNI_SERVICEACCOUNT_DIR": str(sa),
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    }
    host = tmp_path / "host"
    for cmd in _daemonset_commands(rdma_mode):
        assert cmd[0] == "/opt/rdma-cni/install.sh"
        argv = [str(bundle / "install.sh")] + [
            str(bundle) if a == "/opt/rdma-cni/bundle" else str(host) if a == "/host" else a for a in cmd[1:]
        ]
        proc = _run(argv, env=env)
        assert proc.returncode == 0, (cmd, proc.stderr)
    return host


def test_the_daemonset_install_commands_lay_down_a_node_installation(bundle: Path, tmp_path: Path) -> None:
    host = _run_daemonset_installs(bundle, tmp_path)
    meta = json.loads((host / "etc/cni/net.d/00-rdma-multus.conflist").read_text())["plugins"][0]
    # Node paths in the node's configs, not the container's /host view.
    assert meta["confDir"] == "/etc/cni/net.d/rdma-multus.d"
    assert meta["kubeletRootDir"] == "/var/lib/kubelet" and meta["defaultDelegates"] == "tke-route-eni"
    assert (host / "etc/cni/net.d/rdma-multus.d/rdma-multus.kubeconfig").is_file()
    for name in NAMES:
        assert os.readlink(host / "opt/cni/bin" / name) == f"rdma-cni.d/current/{name}"


def test_doctor_of_the_installed_bundle_reads_the_installation(bundle: Path, tmp_path: Path) -> None:
    """The frozen cni-tool's doctor on what install.sh laid down: binaries with their build, the
    configs, and the one thing install.sh cannot provide (the cluster network's own config)."""
    bin_dir = _installed(bundle, tmp_path / "root")
    conf_dir = tmp_path / "root/etc/cni/net.d"
    (tmp_path / "sys").mkdir()
    args = [
        "doctor",
        "--json",
        "--cni-bin-dir",
        str(bin_dir),
        "--conf-dir",
        str(conf_dir),
        "--sysfs-root",
        str(tmp_path / "sys"),
        "--kubelet-root-dir",
        str(tmp_path / "kubelet"),
        "--data-dir",
        str(tmp_path / "state"),
        "--run-dir",
        str(tmp_path / "run"),
    ]
    proc = _run([str(bin_dir / "cni-tool"), *args], env=bare_env(tmp_path))
    assert proc.returncode == 1, proc.stderr  # no RDMA here, and no tke-route-eni config
    found = {f["check"]: f for f in json.loads(proc.stdout)["findings"]}
    build_id = (bundle / "BUILD_ID").read_text().strip()
    for name in ("rdma-macvlan", "rdma-multus"):
        assert found[f"binary {name}"]["status"] == "OK"
        assert f"(build {build_id})" in found[f"binary {name}"]["detail"]
    assert found["runtime-config"]["status"] == "OK"
    assert found["config tke-rdma-macvlan"]["status"] == "OK"
    assert found["default-network tke-route-eni"]["status"] == "FAIL"
    assert "tke-route-eni" in found["default-network tke-route-eni"]["fix"]
    assert found["rdma-devices"]["status"] == "FAIL"


# ---- the thin client in front of the plugins: rdma-agent warm, the bundle cold -----------------------


def _version(bin_dir: Path, name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return _run([str(bin_dir / name)], env=env, input='{"cniVersion":"1.0.0"}')


def _wait_for(predicate: Any, what: str, agent: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert agent.poll() is None, f"rdma-agent exited with {agent.returncode} before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def _running_agent(bin_dir: Path, tmp_path: Path) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes]]]:
    """The installed bundle's rdma-agent, as the DaemonSet runs it (reconcile off: it must not touch
    anything here); yields (socket, log file, process), killed by pid at the end."""
    if os.geteuid() != 0:
        pytest.skip("rdma-agent serves root only (its socket is chowned to root)")
    sock = tmp_path / "run" / "agent.sock"
    log = tmp_path / "agent.log"
    argv = [str(bin_dir / "rdma-cni.d/current/rdma-cni"), "rdma-agent", "--socket", str(sock)]
    argv += ["--reconcile-interval", "-1", "--conf-dir", str(tmp_path / "no-confs"), "--log-file", str(log)]
    agent = subprocess.Popen(
        argv, env=bare_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for(sock.exists, "its socket", agent)
        yield sock, log, agent
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=30)


def test_installed_plugins_answer_version_through_the_client_with_and_without_an_agent(
    bundle: Path, tmp_path: Path
) -> None:
    """The installed rdma-macvlan / rdma-multus (the C client): no agent -> the bundle answers; the
    installed rdma-agent running -> it answers, with fallback made impossible; agent killed -9
    (its socket file left behind) -> the bundle answers again. The same bytes every time."""
    root = tmp_path / "root"
    bin_dir = _installed(bundle, root)
    sock = tmp_path / "run" / "agent.sock"
    env = bare_env(tmp_path, CNI_COMMAND="VERSION", RDMA_CNI_AGENT_SOCKET=str(sock))

    cold = {name: _version(bin_dir, name, env) for name in PLUGINS}
    for name, proc in cold.items():
        assert proc.returncode == 0, (name, proc.stderr)
        assert {"0.3.1", "1.0.0", "1.1.0"} <= set(json.loads(proc.stdout)["supportedVersions"]), name

    agent_argv = [str(bin_dir / "rdma-cni.d/current/rdma-cni"), "rdma-agent"]
    with _running_agent(bin_dir, tmp_path) as (sock, log, agent):
        assert sock.stat().st_mode & 0o777 == 0o600
        probe = _run([*agent_argv, "--probe", "--socket", str(sock)], env=bare_env(tmp_path))
        assert probe.returncode == 0, probe.stderr
        # A fallback would exec /bin/false and fail: an answer here came from the agent.
        warm_env = {**env, "RDMA_CNI_FALLBACK": "/bin/false"}
        for name in PLUGINS:
            warm = _version(bin_dir, name, warm_env)
            assert (warm.returncode, warm.stdout) == (0, cold[name].stdout), (name, warm.stderr)
        _wait_for(
            lambda: all(f"served {n} VERSION" in log.read_text() for n in PLUGINS), "the served log", agent
        )
        agent.kill()
        agent.wait(timeout=30)
        assert sock.exists()  # stale: connect() is refused, and the client must fall back
        assert _version(bin_dir, "rdma-macvlan", warm_env).returncode != 0  # proves it fell back
        for name in PLUGINS:
            again = _version(bin_dir, name, env)
            assert (again.returncode, again.stdout) == (0, cold[name].stdout), (name, again.stderr)
        probe = _run([*agent_argv, "--probe", "--socket", str(sock)], env=bare_env(tmp_path))
        assert probe.returncode == 1 and "no agent answered" in probe.stderr


def test_installed_agent_serves_metrics_from_the_frozen_bundle(bundle: Path, tmp_path: Path) -> None:
    """The frozen rdma-agent carries prometheus_client and the collector: --metrics-address answers
    /metrics with every section read (in a netns of its own: a loopback port, nothing else)."""
    if os.geteuid() != 0:
        pytest.skip("rdma-agent serves root only; the netns needs root")
    bin_dir = _installed(bundle, tmp_path / "root")
    ns = f"h13-bundle-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    agent = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        sock = tmp_path / "run" / "agent.sock"
        argv = ["ip", "netns", "exec", ns, str(bin_dir / "rdma-cni.d/current/rdma-cni"), "rdma-agent",
                "--socket", str(sock), "--reconcile-interval", "-1", "--conf-dir", str(tmp_path / "none"),
                "--metrics-address", "127.0.0.1:9513"]
        agent = subprocess.Popen(argv, env=bare_env(tmp_path), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        # the agent notes its endpoint once it holds the socket (a second agent that fails to bind must
        # not overwrite the first one's note): wait for the note, not the socket
        note_path = tmp_path / "run" / "agent-metrics.json"
        _wait_for(note_path.exists, "its metrics note beside the socket", agent)
        assert sock.exists()
        note = json.loads(note_path.read_text())
        assert note["url"] == "http://127.0.0.1:9513/metrics"
        fetch = [str(bin_dir / "rdma-cni.d/current/rdma-cni"), "cni-tool", "doctor", "--json",
                 "--netns", f"/run/netns/{ns}", "--run-dir", str(tmp_path / "run")]

        def answered() -> bool:
            out = _run(fetch, env=bare_env(tmp_path, RDMA_CNI_AGENT_SOCKET=str(sock))).stdout
            found = [f for f in json.loads(out or "{}").get("findings", []) if f["check"] == "metrics"]
            return bool(found) and found[0]["status"] == "OK"

        _wait_for(answered, "cni-tool doctor to see /metrics answer", agent, timeout=60)
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait(timeout=30)
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_build_without_a_c_compiler_stops_before_freezing(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    proc = _run(
        [str(REPO / "scripts" / "build"), "--out", str(out)], env={**os.environ, "CC": "/nonexistent/cc"}
    )
    assert proc.returncode == 1
    assert "--without-client" in proc.stderr and "PyInstaller" not in proc.stderr
    assert not (out / "rdma-cni").exists()


@pytest.mark.slow
def test_build_without_client_links_the_plugins_to_the_bundle(tmp_path: Path) -> None:
    """--without-client: no C client; the plugins are the bundle (which asks the agent itself)."""
    out = tmp_path / "dist"
    proc = _run([str(REPO / "scripts" / "build"), "--out", str(out), "--without-client"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    bundle = out / "rdma-cni"
    assert not (bundle / "rdma-cni-client").exists()
    for name in (*NAMES, "rdma-agent"):
        assert os.readlink(bundle / name) == "rdma-cni", name
    version = _version(bundle, "rdma-macvlan", bare_env(tmp_path, CNI_COMMAND="VERSION"))
    assert version.returncode == 0 and "supportedVersions" in version.stdout, version.stderr


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
             "--log-file", ""],
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
             "--cni-conf", str(tmp_path / "none.conf"), "--run-dir", str(tmp_path / "run"), "--log-file", ""],
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
    bin_dir = _installed(bundle, tmp_path / "root")
    assert os.readlink(bin_dir / "rdma-ipvlan") == "rdma-cni.d/current/rdma-ipvlan"
    env = bare_env(tmp_path, CNI_COMMAND="VERSION")
    proc = _version(bin_dir, "rdma-ipvlan", env)
    assert proc.returncode == 0 and "1.1.0" in json.loads(proc.stdout)["supportedVersions"], proc.stderr
    conf = {"cniVersion": "1.1.0", "name": "tke-rdma-ipvlan", "type": "rdma-ipvlan", "link": "vxlan",
            "logFile": ""}
    env = bare_env(tmp_path, CNI_COMMAND="STATUS", CNI_PATH=str(bin_dir))
    proc = _run([str(bin_dir / "rdma-ipvlan")], env=env, input=json.dumps(conf))
    answer = json.loads(proc.stdout)
    assert proc.returncode == 1 and answer["code"] == 7 and "'link'" in answer["msg"], proc.stdout


# ---- --rdma-mode: the shared mode's delegate config and the device plugin's pools ----------------------

DELEGATES = "etc/cni/net.d/rdma-multus.d"
DP_CONF = "etc/rdma-cni/device-plugin.yaml"
BEFORE_RDMA_MODE = "fccef42"  # the last commit whose install.sh had no --rdma-mode


def _contents(root: Path) -> dict[str, tuple[str, str]]:
    """Like _tree, by content instead of mtime: what two installers laid down, comparable."""
    return _walk(root, lambda p: f"{p.stat().st_mode:o}:{p.read_bytes().hex()}")


def _device_plugin_config(root: Path, tmp_path: Path) -> Any:
    """The installed device plugin config as the plugin loads it: its cniConf read in the host root."""
    yaml = pytest.importorskip("yaml")
    from rdma_cni.devices.config import load_config

    written = yaml.safe_load((root / DP_CONF).read_text())
    for d in ("sys", "dev"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    flags = {
        "sysfs_root": str(tmp_path / "sys"),
        "dev_root": str(tmp_path / "dev"),
        "cni_conf": str(root / written["cniConf"].lstrip("/")),
    }
    return written, load_config(flags, str(root / DP_CONF))


def test_shared_install_writes_the_ipvlan_delegate_and_one_shared_pool_of_1000(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    proc = install(
        bundle, root, "--mode", "vpc-cni", "--rdma-mode", "shared", "--conf-dir", "/etc/cni/custom.d"
    )
    assert proc.returncode == 0, proc.stderr
    delegates = root / "etc/cni/custom.d/rdma-multus.d"
    shipped = (bundle / "conf/shared-mode/rdma-multus.d/tke-rdma-ipvlan.conf").read_bytes()
    assert (delegates / "tke-rdma-ipvlan.conf").read_bytes() == shipped
    assert json.loads(shipped)["name"] == "tke-rdma-ipvlan"
    assert (delegates / "tke-rdma-macvlan.conf").is_file()  # exclusive pods' DEL keeps working
    written, cfg = _device_plugin_config(root, tmp_path)
    # A node path (the --conf-dir given), not the installer's --host-root view.
    assert written["cniConf"] == "/etc/cni/custom.d/rdma-multus.d/tke-rdma-ipvlan.conf"
    assert [(s.resource_name, s.mode, s.count) for s in cfg.pool_specs()] == [
        ("tke.cloud.tencent.com/tke-shared-rdma", "shared", 1000)
    ]
    assert cfg.data_dir == "/var/lib/cni/rdma-ipvlan"  # the device plugin follows rdma-ipvlan's records
    assert oct((root / DP_CONF).stat().st_mode & 0o777) == "0o644"
    assert not list((root / "etc/rdma-cni").glob(".*tmp*"))  # written by rename: no temp file left


def test_exclusive_rdma_mode_writes_only_the_device_plugins_exclusive_pool(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    assert install(bundle, root, "--mode", "vpc-cni", "--rdma-mode", "exclusive").returncode == 0
    assert sorted(p.name for p in (root / DELEGATES).iterdir()) == ["tke-rdma-macvlan.conf"]
    written, cfg = _device_plugin_config(root, tmp_path)
    assert written["cniConf"] == "/etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf"
    assert [(s.resource_name, s.mode) for s in cfg.pool_specs()] == [
        ("tke.cloud.tencent.com/tke-shared-rdma", "exclusive")
    ]
    assert cfg.data_dir == "/var/lib/cni/rdma-macvlan"


def test_without_rdma_mode_the_install_is_byte_for_byte_the_previous_one(
    bundle: Path, tmp_path: Path
) -> None:
    old = tmp_path / "install-before.sh"
    proc = _run(["git", "-C", str(REPO), "show", f"{BEFORE_RDMA_MODE}:scripts/install.sh"])
    if proc.returncode != 0:
        pytest.skip(f"no git history with {BEFORE_RDMA_MODE} here: {proc.stderr.strip()}")
    old.write_text(proc.stdout)
    old.chmod(0o755)
    for args in (["--mode", "vpc-cni"], []):
        roots = (tmp_path / f"old{len(args)}", tmp_path / f"new{len(args)}")
        before = _run([str(old), "--bundle", str(bundle), "--host-root", str(roots[0]), *args])
        now = install(bundle, roots[1], *args)
        assert before.returncode == now.returncode == 0, now.stderr
        assert _contents(roots[0]) == _contents(roots[1]), args
        assert not (roots[1] / "etc/rdma-cni").exists()


def test_shared_install_is_idempotent(bundle: Path, tmp_path: Path) -> None:
    args = ("--mode", "vpc-cni", "--rdma-mode", "shared")
    assert install(bundle, tmp_path, *args).returncode == 0
    before = _tree(tmp_path)
    proc = install(bundle, tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    assert _tree(tmp_path) == before, "a second install changed files"
    assert "wrote" not in proc.stderr and "linked" not in proc.stderr and "switching" not in proc.stderr


def test_a_bad_rdma_mode_names_the_option_and_changes_nothing(bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    for bad in ("Shared", "ipvlan", ""):
        proc = install(bundle, root, "--mode", "vpc-cni", "--rdma-mode", bad)
        assert proc.returncode != 0
        assert proc.stderr.strip() == f"install.sh: --rdma-mode must be exclusive or shared, got '{bad}'"
        assert not root.exists()
    # On an installed node too: nothing of the installation changes.
    assert install(bundle, root, "--rdma-mode", "shared").returncode == 0
    before = _tree(root)
    assert install(bundle, root, "--rdma-mode", "exclusiv").returncode != 0
    assert _tree(root) == before


def test_uninstall_removes_the_shared_files_and_refuses_while_pods_hold_addresses(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    assert install(bundle, root, "--mode", "vpc-cni", "--rdma-mode", "shared").returncode == 0
    (root / "opt/cni/bin/macvlan").write_text("#!/bin/sh\n")  # someone else's: never touched
    held = root / "var/lib/cni/rdma-ipvlan/attachments"
    held.mkdir(parents=True)
    (held / "c1@eth1.json").write_text("{}")
    uninstall = [str(bundle / "install.sh"), "--host-root", str(root), "--uninstall"]
    proc = _run(uninstall)
    assert proc.returncode != 0 and "DEL needs rdma-ipvlan" in proc.stderr
    assert (root / DELEGATES / "tke-rdma-ipvlan.conf").is_file() and (root / DP_CONF).is_file()
    (held / "c1@eth1.json").unlink()
    proc = _run(uninstall)
    assert proc.returncode == 0, proc.stderr
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert left == ["opt/cni/bin/macvlan"]
    assert not (root / "etc/rdma-cni").exists()


@pytest.mark.parametrize(
    ("start", "switch", "state"),
    [("shared", "exclusive", "rdma-ipvlan"), ("exclusive", "shared", "rdma-macvlan")],
)
def test_switching_the_rdma_mode_refuses_while_a_pod_holds_a_bond_or_an_address(
    bundle: Path, tmp_path: Path, start: str, switch: str, state: str
) -> None:
    assert install(bundle, tmp_path, "--mode", "vpc-cni", "--rdma-mode", start).returncode == 0
    held = tmp_path / "var/lib/cni" / state / "attachments"
    held.mkdir(parents=True)
    (held / "c1@eth1.json").write_text("{}")
    before = _tree(tmp_path)
    proc = install(bundle, tmp_path, "--mode", "vpc-cni", "--rdma-mode", switch)
    assert proc.returncode != 0
    assert f"this node runs {start} mode and pods still hold bonds or addresses" in proc.stderr
    assert "--force" in proc.stderr
    assert _tree(tmp_path) == before, "a refused switch changed files"
    # The same mode again is no switch: it goes through with the pod there.
    assert install(bundle, tmp_path, "--mode", "vpc-cni", "--rdma-mode", start).returncode == 0
    proc = install(bundle, tmp_path, "--mode", "vpc-cni", "--rdma-mode", switch, "--force")
    assert proc.returncode == 0, proc.stderr
    _, cfg = _device_plugin_config(tmp_path, tmp_path / "dp")
    assert [s.mode for s in cfg.pool_specs()] == [switch]
    assert (tmp_path / DELEGATES / "tke-rdma-ipvlan.conf").is_file() == (switch == "shared")
    assert (tmp_path / DELEGATES / "tke-rdma-macvlan.conf").is_file()


def test_the_daemonset_install_commands_with_rdma_mode_shared_lay_down_a_shared_node(
    bundle: Path, tmp_path: Path
) -> None:
    host = _run_daemonset_installs(bundle, tmp_path, "shared")
    assert (host / DELEGATES / "tke-rdma-ipvlan.conf").is_file()
    written, cfg = _device_plugin_config(host, tmp_path)
    assert written["cniConf"] == "/etc/cni/net.d/rdma-multus.d/tke-rdma-ipvlan.conf"
    assert [(s.mode, s.count) for s in cfg.pool_specs()] == [("shared", 1000)]
