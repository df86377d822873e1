"""The test cluster's images (tests/cluster/images.py) served by its own registry (tests/cluster/registry.py).

Why: no image registry on the internet is reachable where the cluster runs, and kubelet pulls every
image from the local registry through containerd's docker.io / registry.k8s.io mirrors; an image at
the wrong repository path, with the wrong entrypoint, without install.sh, or a pause that is not a
static binary would only show up as a pod stuck in ErrImagePull or a sandbox that never starts, deep
in a cluster run. Here: the images are built (or taken from the cache: the second call must build
nothing), the registry runs in a network namespace of the test's own on 127.0.0.1, every image is
pushed, and each is read back over HTTP at the path containerd asks a mirror for, its config and
its files checked; then the cluster's own containerd (when scripts/cluster build has made it) pulls
every image by its upstream name through docker.io / registry.k8s.io mirrors. Needs root (netns),
buildah, mmdebstrap, gcc and Go; the first build needs the Debian mirror and the Go module proxy
(~2.5 min), later runs only the cache (~12 s alone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import images as im
from cluster import registry as reg
from cluster.versions import CONTAINERD_BUILD

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
TAGS = ("0.1.0", "0.1.1")
ADDR = "127.0.0.1:5000"


def _missing() -> str:
    if os.geteuid() != 0:
        return "needs root (a network namespace for the registry, mmdebstrap --mode=root)"
    tools = [t for t in ("buildah", "mmdebstrap", "gcc", "go", "nsenter", "ip") if shutil.which(t) is None]
    return f"missing {' '.join(tools)} (apt-get install buildah mmdebstrap)" if tools else ""


@pytest.fixture(scope="module")
def images() -> list[im.Image]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    return im.build_images(REPO, im.DEFAULT_CACHE_ROOT, TAGS)


@pytest.fixture(scope="module")
def bins() -> reg.RegistryBins:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    return reg.build_registry(im.DEFAULT_CACHE_ROOT)


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    """A network namespace of these tests' own, loopback up; deleted afterwards, also on failure."""
    name = f"rdmacni-reg-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture(scope="module")
def registry(
    images: list[im.Image], bins: reg.RegistryBins, netns: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """The registry serving 127.0.0.1:5000 in ``netns`` with every image pushed: the netns and what
    each push answered (``<addr>/<repo>@<digest>``). The process we started is ended by its pid."""
    proc = reg.start_registry(bins, ADDR, tmp_path_factory.mktemp("registry"), netns)
    try:
        yield netns, {i.ref: reg.push(bins, i, ADDR, netns) for i in images}
    finally:
        reg.stop_registry(proc)


def _http_get(netns: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """GET http://127.0.0.1:5000<path> from inside ``netns``, asking for what containerd accepts."""
    code = r"""
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"Accept": ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json"])})
with urllib.request.urlopen(req, timeout=30) as r:
    body = r.read()
    print(json.dumps({"status": r.status, "headers": dict(r.headers), "body": body.decode()}))
"""
    out = subprocess.run(
        reg.in_netns([sys.executable, "-c", code, f"http://{ADDR}{path}"], netns),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    d = json.loads(out)
    return int(d["status"]), {k.lower(): v for k, v in d["headers"].items()}, d["body"].encode()


def _export_names(
    bins: reg.RegistryBins, netns: str, ref: str, extract: str | None = None
) -> tuple[set[str], bytes]:
    """The paths of ``ref``'s flattened filesystem (``crane export`` from the registry), and the
    content of the member ``extract`` when given."""
    proc = subprocess.Popen(
        reg.in_netns([bins.crane, "export", "--insecure", f"{ADDR}/{reg.registry_path(ref)}", "-"], netns),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    names: set[str] = set()
    content = b""
    try:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for m in tar:
                name = m.name.removeprefix("./")
                names.add(name)
                if name == extract:
                    f = tar.extractfile(m)
                    assert f is not None
                    content = f.read()
    finally:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")
    return names, content


_PT_INTERP = 3


def _program_header_types(elf: bytes) -> list[int]:
    """p_type of each program header of an ELF64 little-endian file (a PT_INTERP one names the
    dynamic loader: a static binary has none)."""
    phoff = int.from_bytes(elf[32:40], "little")
    phentsize = int.from_bytes(elf[54:56], "little")
    phnum = int.from_bytes(elf[56:58], "little")
    return [
        int.from_bytes(elf[phoff + i * phentsize : phoff + i * phentsize + 4], "little") for i in range(phnum)
    ]


def _archive_repo_tags(image: im.Image) -> list[str]:
    with tarfile.open(image.archive) as tar:
        f = tar.extractfile("manifest.json")
        assert f is not None
        manifest = json.loads(f.read())
    assert len(manifest) == 1, f"{image.archive}: one image per archive"
    return list(manifest[0]["RepoTags"])


def test_a_second_call_builds_nothing(images: list[im.Image]) -> None:
    refs = [i.ref for i in images]
    assert refs == [
        im.BASE_REF,
        *(f"{im.PRODUCT_REPO}:{t}" for t in TAGS),
        im.TEST_REF,
        im.PAUSE_REF,
    ]
    before = {i.archive: i.archive.stat().st_mtime_ns for i in images}
    t0 = time.monotonic()
    again = im.build_images(REPO, im.DEFAULT_CACHE_ROOT, TAGS)
    took = time.monotonic() - t0
    assert again == images
    assert {i.archive: i.archive.stat().st_mtime_ns for i in again} == before, (
        "a cached image was saved again"
    )
    assert took < 10, f"the cached call took {took:.1f} s: it built something"
    for i in images:
        assert _archive_repo_tags(i) == [i.ref], f"{i.archive} does not keep the image's full name"


def test_every_image_is_served_where_containerd_asks_a_mirror_for_it(
    images: list[im.Image], bins: reg.RegistryBins, registry: tuple[str, dict[str, str]]
) -> None:
    netns, pushed = registry
    assert reg.registry_path("docker.io/library/rdma-cni:0.1.0") == "library/rdma-cni:0.1.0"
    assert reg.registry_path("registry.k8s.io/pause:3.10.1") == "pause:3.10.1"
    assert reg.registry_path("rdma-cni:0.1.0") == "library/rdma-cni:0.1.0"

    configs: dict[str, dict[str, object]] = {}
    manifests: dict[str, dict[str, object]] = {}
    for i in images:
        repo, tag = reg.registry_path(i.ref).rsplit(":", 1)
        # containerd's request to a docker.io mirror for docker.io/library/X:T is /v2/library/X/...
        status, headers, body = _http_get(netns, f"/v2/{repo}/manifests/{tag}")
        assert status == 200
        assert pushed[i.ref].endswith("@" + headers["docker-content-digest"]), (i.ref, pushed[i.ref], headers)
        manifest = json.loads(body)
        manifests[i.ref] = manifest
        config_digest = manifest["config"]["digest"]
        status, _, blob = _http_get(netns, f"/v2/{repo}/blobs/{config_digest}")
        assert status == 200
        configs[i.ref] = json.loads(blob)
        assert configs[i.ref]["os"] == "linux" and configs[i.ref]["architecture"] == "amd64"

    def cfg(ref: str) -> dict[str, object]:
        c = configs[ref]["config"]
        assert isinstance(c, dict)
        return c

    assert cfg(im.BASE_REF)["Cmd"] == ["bash"]
    assert cfg(im.PAUSE_REF)["Entrypoint"] == ["/pause"]
    assert cfg(im.PAUSE_REF)["User"] == "65535:65535"
    assert cfg(im.TEST_REF)["Cmd"] == ["sleep", "infinity"]
    for t in TAGS:
        ref = f"{im.PRODUCT_REPO}:{t}"
        assert cfg(ref)["Entrypoint"] == ["/opt/rdma-cni/install.sh"]
        labels = cfg(ref)["Labels"]
        assert isinstance(labels, dict) and labels[im.VERSION_LABEL] == t

    # Two tags of one bundle: two digests (a rolling update changes the image), the same real layers.
    a, b = (manifests[f"{im.PRODUCT_REPO}:{t}"] for t in TAGS)
    assert a["config"] != b["config"]
    layers_a, layers_b = a["layers"], b["layers"]
    assert isinstance(layers_a, list) and isinstance(layers_b, list)
    assert [x["digest"] for x in layers_a[:2]] == [x["digest"] for x in layers_b[:2]]

    # Every image is pushed from its OCI layout (gzip layers made once); the docker-archive pushes
    # too (crane compresses it on the way) and is the same image: the same config blob.
    assert all(i.oci_layout is not None for i in images)
    pause = next(i for i in images if i.ref == im.PAUSE_REF)
    via_archive = reg.push(
        bins, im.Image("registry.k8s.io/pause-from-archive:3.10.1", pause.archive), ADDR, netns
    )
    assert via_archive.startswith(f"{ADDR}/pause-from-archive@sha256:")
    _, _, body = _http_get(netns, "/v2/pause-from-archive/manifests/3.10.1")
    assert json.loads(body)["config"]["digest"] == manifests[im.PAUSE_REF]["config"]["digest"]  # type: ignore[index]

    # The product image: the node bundle and its installer where the DaemonSet runs them.
    names, _ = _export_names(bins, netns, f"{im.PRODUCT_REPO}:{TAGS[0]}")
    for path in (
        "opt/rdma-cni/install.sh",
        "opt/rdma-cni/bundle/rdma-cni",
        "opt/rdma-cni/bundle/rdma-macvlan",
        "opt/rdma-cni/bundle/BUILD_ID",
        "opt/rdma-cni/bundle/install.sh",
        "usr/bin/sh",
    ):
        assert path in names, f"rdma-cni image has no /{path}"

    # The seed pods' image: a shell, sleep, ip, ping, cat, ls.
    names, _ = _export_names(bins, netns, im.TEST_REF)
    for tool in ("sh", "sleep", "ip", "ping", "cat", "ls"):
        assert any(f"{d}/{tool}" in names for d in ("usr/bin", "usr/sbin", "bin", "sbin")), f"no {tool}"

    # pause: the only file, static (no program interpreter), and it is Kubernetes' pause.c.
    names, binary = _export_names(bins, netns, im.PAUSE_REF, extract="pause")
    assert names == {"pause"}
    assert binary.startswith(b"\x7fELF\x02\x01"), "not a little-endian ELF64"
    assert _PT_INTERP not in _program_header_types(binary), "pause is dynamically linked"
    exe = Path(f"/tmp/pause-{uuid.uuid4().hex[:8]}")
    try:
        exe.write_bytes(binary)
        exe.chmod(0o755)
        out = subprocess.run([exe, "-v"], capture_output=True, text=True, timeout=10, check=True)
    finally:
        exe.unlink(missing_ok=True)
    assert "pause.c v3.10.1" in out.stdout + out.stderr


# Only the content store and the pull matter here; CRI would want a network and a runtime.
CRI_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime")


def _containerd_bin() -> Path | None:
    """The cluster's own containerd (scripts/cluster build), the one whose resolver the nodes use."""
    d = CONTAINERD_BUILD.bin_dir
    return d if (d / "containerd").is_file() and (d / "ctr").is_file() else None


def test_containerd_pulls_each_image_through_the_docker_io_and_registry_k8s_io_mirrors(
    images: list[im.Image], registry: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """What the nodes do: containerd, given hosts.toml files that mirror docker.io and registry.k8s.io
    to the registry, pulls each image by its upstream name (and unpacks it)."""
    bin_dir = _containerd_bin()
    if bin_dir is None:
        pytest.skip(f"no containerd in {CONTAINERD_BUILD.bin_dir} (scripts/cluster build makes it)")
    netns, pushed = registry
    work = Path(tempfile.mkdtemp(prefix="ctrd-", dir="/tmp"))  # short: the socket path
    certs = work / "certs.d"
    for host in ("docker.io", "registry.k8s.io"):
        (certs / host).mkdir(parents=True)
        (certs / host / "hosts.toml").write_text(
            f'server = "http://{ADDR}"\n\n[host."http://{ADDR}"]\n  capabilities = ["pull", "resolve"]\n'
        )
    sock = work / "containerd.sock"
    (work / "config.toml").write_text(
        f"""version = 3
root = "{work}/root"
state = "{work}/state"
disabled_plugins = {json.dumps(list(CRI_PLUGINS))}
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
"""
    )
    with open(tmp_path / "containerd.log", "wb") as logf:
        proc = subprocess.Popen(
            reg.in_netns([bin_dir / "containerd", "--config", work / "config.toml"], netns),
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=logf,
            start_new_session=True,
        )
    try:
        ctr = [str(bin_dir / "ctr"), "--address", str(sock)]
        deadline = time.monotonic() + 30
        while subprocess.run([*ctr, "version"], capture_output=True, check=False).returncode != 0:
            assert proc.poll() is None, (tmp_path / "containerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "containerd did not answer within 30 s"
            time.sleep(0.2)
        for i in images:
            r = subprocess.run(
                reg.in_netns([*ctr, "images", "pull", "--hosts-dir", certs, i.ref], netns),
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert r.returncode == 0, f"{i.ref}: {r.stderr[-3000:]}"
        listed = subprocess.run([*ctr, "images", "ls"], capture_output=True, text=True, check=True).stdout
        rows = {line.split()[0]: line.split()[2] for line in listed.splitlines()[1:] if line.strip()}
        for i in images:
            assert i.ref in rows, listed
            assert pushed[i.ref].endswith("@" + rows[i.ref]), (i.ref, pushed[i.ref], rows[i.ref])
    finally:
        reg.stop_registry(proc)  # the same SIGTERM-then-SIGKILL by pid
        shutil.rmtree(work, ignore_errors=True)
