"""The release's SBOMs (CycloneDX 1.6 JSON), one per artifact, of what each one really holds:

- the node bundle: the Python distributions PyInstaller froze into it (found in the frozen
  program's own archive and its ``_internal/``, then described by cyclonedx-py, which reads the
  build environment's metadata: licences, purls, dependencies), the CPython that runs them, and the
  shared libraries it carries (each named by the Debian package of this machine it came from, or
  else by its file name and hash);
- the image: all of that, plus every Debian package installed in the image (its dpkg status).

    bom = bundle_bom(bundle_dir, pyproject, epoch)
    image = image_bom(bom, dpkg_status_text, name, version, purl)
    write(bom, path)                # validated against the CycloneDX schema first

Run by the interpreter that froze the bundle (scripts/build's, the project's venv): its metadata is
the one the bundle's distributions come from.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

Bom = dict[str, Any]
Component = dict[str, Any]

SPEC = "1.6"
DEBIAN_DISTRO = "debian-12"
UUID_NAMESPACE = uuid.UUID("5b7c7a63-0d1b-4c55-9d38-2a8f1c6d0e41")  # the serial numbers' (uuid5)


class SbomError(RuntimeError):
    """An SBOM could not be made or did not validate: the message says which and why."""


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SbomError(f"{' '.join(argv[:3])}: exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    return proc.stdout


def _norm(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- what the bundle holds ----------------------------------------------------------------------


def frozen_modules(program: Path) -> set[str]:
    """Top-level names of the modules in the frozen program's archive (PyInstaller's PYZ)."""
    out = _run([sys.executable, "-m", "PyInstaller.utils.cliutils.archive_viewer", "-r", "-b", str(program)])
    names: set[str] = set()
    in_pyz = False
    for line in out.splitlines():
        if line.startswith("Contents of "):
            in_pyz = "(PYZ)" in line
        elif in_pyz and line.strip():
            names.add(line.strip().split(".")[0])
    if not names:
        raise SbomError(f"{program}: no PYZ archive listed (is it a PyInstaller program?)")
    return names


def bundled_distributions(bundle: Path) -> set[str]:
    """Normalised names of the distributions whose modules (or metadata) the bundle carries."""
    tops = frozen_modules(bundle / "rdma-cni")
    dists: set[str] = set()
    for entry in (bundle / "_internal").iterdir():
        if entry.name.endswith(".dist-info"):
            dists.add(_norm(entry.name.split("-")[0]))
        tops.add(entry.name.split(".")[0])
    for top, owners in importlib.metadata.packages_distributions().items():
        if top in tops:
            dists.update(_norm(o) for o in owners)
    return dists


def _ldconfig() -> dict[str, str]:
    """Library file name -> its path, as the dynamic linker finds it on this machine."""
    found: dict[str, str] = {}
    for line in _run(["ldconfig", "-p"]).splitlines():
        m = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)", line)
        if m is None:
            continue
        if "x86-64" in m.group(2) or "AArch64" in m.group(2):  # the 64-bit one over a multilib copy
            found[m.group(1)] = m.group(3)
        else:
            found.setdefault(m.group(1), m.group(3))
    return found


def _deb_of(path: str) -> Component | None:
    """The Debian package that installed ``path`` on this machine, as a component."""
    proc = subprocess.run(["dpkg", "-S", os.path.realpath(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        proc = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    package = proc.stdout.split(":", 1)[0].strip()
    fields = _run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Architecture}", package])
    name, version, arch = fields.split("\t")
    return deb_component(name, version, arch)


def _file_component(path: Path) -> Component:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {
        "type": "file",
        "bom-ref": f"file:{path.name}@{digest[:16]}",
        "name": path.name,
        "hashes": [{"alg": "SHA-256", "content": digest}],
    }


def shared_libraries(bundle: Path) -> list[Component]:
    """The shared libraries in the bundle but CPython's own: each as the Debian package of this
    machine the linker finds it in, else as a file with its hash (PyInstaller strips its copy, so
    the hash is the bundle's file, not the package's)."""
    where = _ldconfig()
    out: dict[str, Component] = {}
    for lib in sorted((bundle / "_internal").glob("lib*.so*")):
        if lib.name.startswith("libpython"):
            continue
        comp = _deb_of(where[lib.name]) if lib.name in where else None
        comp = comp or _file_component(lib)
        out.setdefault(comp["bom-ref"], comp)
    return list(out.values())


def cpython() -> Component:
    """The interpreter frozen into the bundle (libpython of the build interpreter)."""
    version = platform.python_version()
    return {
        "type": "application",
        "bom-ref": f"pkg:generic/cpython@{version}",
        "name": "cpython",
        "version": version,
        "purl": f"pkg:generic/cpython@{version}",
        "licenses": [{"license": {"id": "PSF-2.0"}}],
    }


def deb_component(name: str, version: str, arch: str) -> Component:
    purl = f"pkg:deb/debian/{name}@{version}?arch={arch}&distro={DEBIAN_DISTRO}"
    return {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}


def dpkg_installed(status: str) -> list[Component]:
    """The packages a dpkg status file says are installed, as components."""
    out = []
    for para in status.split("\n\n"):
        fields = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in para.splitlines() if line[:1] not in (" ", "\t"))
        )
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            out.append(deb_component(fields["Package"], fields["Version"], fields.get("Architecture", "all")))
    return out


# ---- the BOMs -----------------------------------------------------------------------------------


def environment_bom(pyproject: Path, epoch: int) -> Bom:
    """cyclonedx-py's SBOM of this interpreter's environment, the project (pyproject) its root."""
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    argv = [
        sys.executable,
        "-m",
        "cyclonedx_py",
        "environment",
        "--pyproject",
        str(pyproject),
        "--output-reproducible",
        "--sv",
        SPEC,
        "--of",
        "JSON",
        "-o",
        "-",
        sys.executable,
    ]
    bom: Bom = json.loads(_run(argv, env))
    return bom


def _keep(bom: Bom, components: list[Component]) -> Bom:
    """``bom`` with exactly ``components``; dependencies pruned to the refs that remain."""
    out = copy.deepcopy(bom)
    out["components"] = components
    refs = {c["bom-ref"] for c in components} | {out["metadata"]["component"]["bom-ref"]}
    deps = []
    for d in out.get("dependencies", []):
        if d["ref"] in refs:
            deps.append({**d, "dependsOn": [r for r in d.get("dependsOn", []) if r in refs]})
    out["dependencies"] = deps
    return out


def bundle_bom(bundle: Path, pyproject: Path, epoch: int) -> Bom:
    """The node bundle's SBOM (module docstring)."""
    env = environment_bom(pyproject, epoch)
    inside = bundled_distributions(bundle)
    root = _norm(env["metadata"]["component"]["name"])
    python = [c for c in env["components"] if _norm(c["name"]) in inside and _norm(c["name"]) != root]
    bom = _keep(env, [*python, cpython(), *shared_libraries(bundle)])
    deps = {d["ref"]: d for d in bom["dependencies"]}
    deps.setdefault("root-component", {"ref": "root-component"})["dependsOn"] = sorted(
        c["bom-ref"] for c in bom["components"]
    )
    bom["dependencies"] = list(deps.values())
    build_id = (bundle / "BUILD_ID").read_text().strip()
    bom["metadata"]["component"]["properties"] = [{"name": "rdma-cni:build-id", "value": build_id}]
    return bom


def image_bom(bundle: Bom, dpkg_status: str, name: str, version: str, purl: str) -> Bom:
    """The image's SBOM: the bundle (a component, with everything it holds) and the image's Debian
    packages, under the image as the root."""
    bom = copy.deepcopy(bundle)
    app = bom["metadata"]["component"]
    debs = [
        d
        for d in dpkg_installed(dpkg_status)
        if d["bom-ref"] not in {c["bom-ref"] for c in bom["components"]}
    ]
    bom["components"] = [app, *bom["components"], *debs]
    bom["metadata"]["component"] = {
        "type": "container",
        "bom-ref": purl,
        "name": name,
        "version": version,
        "purl": purl,
    }
    bom["dependencies"].append({"ref": purl, "dependsOn": ["root-component", *(d["bom-ref"] for d in debs)]})
    return bom


def write(bom: Bom, path: Path, serial_seed: str) -> None:
    """Validate ``bom`` against CycloneDX's schema and write it; a deterministic serial number."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    bom = {**bom, "serialNumber": uuid.uuid5(UUID_NAMESPACE, serial_seed).urn}
    text = json.dumps(bom, indent=1, sort_keys=True) + "\n"
    error = JsonStrictValidator(SchemaVersion.from_version(SPEC)).validate_str(text)
    if error is not None:
        raise SbomError(f"{path.name}: not valid CycloneDX {SPEC}: {error}")
    path.write_text(text)
