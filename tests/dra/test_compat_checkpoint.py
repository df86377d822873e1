"""The DRA driver's prepared-claim checkpoint and CDI specs across versions
(docs/compatibility-policy.md, "The DRA driver's checkpoint and CDI specs"): the previous
version's records are read, what this version writes the previous one reads, a claim the
previous driver prepared is answered and unprepared by this one, and a record of a newer schema
stops prepare and unprepare of its claim by name with its record and spec left as they are.

The previous version's records are ``fixtures/prepared-schema1`` (written by the commit in its
``COMMIT``); its code is that commit's ``rdma_cni`` (:mod:`previous_version`), run as the real
``rdma-dra-driver`` on the simulated node of ``test_dra_driver``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import previous_version
import pytest
import test_dra_driver
from dpnode import wait_for
from netns import REPO, can_run
from test_dra_driver import NODE, DraNode, _answers

from rdma_cni.dra.prepared import (
    PREPARED,
    PREPARING,
    ClaimRecordTooNew,
    PreparedClaim,
    PreparedClaims,
    PreparedDevice,
)
from rdma_cni.proto import dra_v1_pb2, dra_v1_pb2_grpc

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "prepared-schema1"
PREPARED_UID = "6f1c0c7e-0b8a-4d6e-9d7e-3c5b9b1a2f10"
PREPARING_UID = "0d9e8f7a-1b2c-4d3e-8f4a-5b6c7d8e9f01"
KIND = "rdma.tke.cloud.tencent.com/bond"

dra = test_dra_driver.dra  # the simulated node, its API server and CDI dir


def fixture_records(tmp: Path) -> PreparedClaims:
    d = tmp / "claims"
    shutil.copytree(FIXTURES, d, ignore=shutil.ignore_patterns("COMMIT", "*.md"))
    return PreparedClaims(str(d))


def newer(doc: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**doc, "schema": 2, "written_by": "0.2.0", "vfio_groups": [17], **extra}


# ------------------------------------------------------------------ the records, no driver
def test_the_previous_versions_records_are_read_as_written(tmp_path: Path) -> None:
    assert (FIXTURES / "COMMIT").read_text().strip() == previous_version.PREVIOUS
    records = fixture_records(tmp_path)
    assert records.uids() == sorted([PREPARED_UID, PREPARING_UID])
    devices = tuple(PreparedDevice("nic", "node-a", f"bond{i}", (f"{KIND}={PREPARED_UID}-mlx5_bond_{i}",))
                    for i in range(2))
    assert records.get(PREPARED_UID) == PreparedClaim(PREPARED_UID, "default", "nics", PREPARED, devices)
    assert records.get(PREPARING_UID) == PreparedClaim(PREPARING_UID, "team-a", "shared", PREPARING, ())


def test_what_this_version_writes_the_previous_one_reads(tmp_path: Path) -> None:
    records = fixture_records(tmp_path)
    theirs = {uid: json.loads(Path(records.path(uid)).read_bytes()) for uid in records.uids()}
    for uid in records.uids():
        rec = records.get(uid)
        assert rec is not None
        records.put(rec)
        mine = json.loads(Path(records.path(uid)).read_bytes())
        assert mine == {"schema": 1, **theirs[uid]}  # one key more, which the previous reader skips
    code = previous_version.unpack(str(tmp_path / "previous"))
    script = ("import sys; from rdma_cni.dra.prepared import PreparedClaims\n"
              "r = PreparedClaims(sys.argv[1]); print(repr([r.get(u) for u in r.uids()]))\n")
    prev = subprocess.run([sys.executable, "-c", script, records.dir], capture_output=True, text=True,
                          check=True, timeout=60, cwd="/", env=dict(os.environ, **previous_version.env(code)))
    assert prev.stdout.strip() == repr([records.get(u) for u in records.uids()])


def test_a_newer_record_is_refused_by_name_unless_its_writer_allows_this_schema(tmp_path: Path) -> None:
    records = fixture_records(tmp_path)
    path = Path(records.path(PREPARED_UID))
    doc = json.loads(path.read_bytes())
    path.write_text(json.dumps(newer(doc)))
    before = path.read_bytes()
    for ask in (records.get, records.refuse_newer):
        with pytest.raises(ClaimRecordTooNew) as err:
            ask(PREPARED_UID)
        text = str(err.value)
        assert text.startswith(f"prepared-claim record {path} has schema 2, but this rdma-dra-driver")
        assert "reads schemas 1: nothing was changed; roll forward to rdma-cni 0.2.0 or later" in text
    assert path.read_bytes() == before
    records.refuse_newer(PREPARING_UID)  # a record this code reads: no refusal
    path.write_text(json.dumps(newer(doc, min_reader_schema=1)))
    rec = records.get(PREPARED_UID)
    assert rec is not None and rec.phase == PREPARED and len(rec.devices) == 2


@pytest.mark.parametrize("schema", ["2", 0, True, None])
def test_a_record_whose_schema_is_not_a_number_is_unreadable_as_before(tmp_path: Path, schema: Any) -> None:
    records = fixture_records(tmp_path)
    path = Path(records.path(PREPARED_UID))
    path.write_text(json.dumps({**json.loads(path.read_bytes()), "schema": schema}))
    assert records.get(PREPARED_UID) is None  # logged; prepared again, as a torn record is
    records.refuse_newer(PREPARED_UID)


# ------------------------------------------------------------------ the real driver
def start(dra: DraNode, code: str = "") -> subprocess.Popen[bytes]:
    """``rdma-dra-driver`` on the simulated node, of this checkout or of the code at ``code``."""
    argv = ["ip", "netns", "exec", dra.d.n.name, sys.executable, "-m", "rdma_cni.cli.dra_driver",
            "--kubelet-root-dir", dra.root, "--sysfs-root", dra.d.sysfs, "--dev-root", dra.d.dev,
            "--cni-conf", dra.d.conf, "--node-name", NODE, "--kubeconfig", str(dra.kubeconfig),
            "--cdi-dir", str(dra.cdi), "--log-file", dra.log, "--log-level", "debug"]
    env = {**os.environ, "PYTHONPATH": REPO, **(previous_version.env(code) if code else {})}
    with open(dra.log + ".stderr", "ab") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO, env=env)
    dra.d.procs.append(proc)
    wait_for(lambda: _answers(dra.reg_socket) or proc.poll() is not None, 60, "registration socket")
    assert proc.poll() is None, dra.log_tail()
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def unprepare(dra: DraNode, uid: str, name: str) -> str:
    with grpc.insecure_channel(f"unix:{dra.dra_socket}") as ch:
        resp = dra_v1_pb2_grpc.DRAPluginStub(ch).NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="default", uid=uid, name=name)]), timeout=20)
    return str(resp.claims[uid].error)


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.exists() else {}


@pytest.fixture
def previous_code(tmp_path: Path) -> str:
    if can_run():
        pytest.skip(can_run())
    return previous_version.unpack(str(tmp_path / "previous"))


@pytest.mark.netns
def test_a_claim_the_previous_driver_prepared_is_answered_and_unprepared_by_this_one(
    dra: DraNode, previous_code: str
) -> None:
    claim = dra.api.add_claim("default", "nics", [("nic", "bond1"), ("nic", "bond2")], node=NODE)
    uid = claim["metadata"]["uid"]
    old = start(dra, previous_code)
    first = dra.prepare(uid, "nics")
    assert first.error == "" and len(first.devices) == 2
    assert "schema" not in dra.records()[f"{uid}.json"]  # the previous version's record
    stop(old)
    claims_dir = Path(dra.root, "plugins", "rdma.tke.cloud.tencent.com", "claims")
    written = files(claims_dir), files(dra.cdi)
    start(dra)  # the upgrade: kubelet asks the new driver again, as after any restart
    assert dra.prepare(uid, "nics") == first
    assert (files(claims_dir), files(dra.cdi)) == written  # answered from the record: nothing rewritten
    assert unprepare(dra, uid, "nics") == ""
    assert dra.specs() == [] and dra.records() == {}


@pytest.mark.netns
def test_a_newer_record_stops_prepare_and_unprepare_of_its_claim_and_keeps_its_spec(
    dra: DraNode
) -> None:
    claim = dra.api.add_claim("default", "nics", [("nic", "bond3")], node=NODE)
    uid = claim["metadata"]["uid"]
    proc = start(dra)
    assert dra.prepare(uid, "nics").error == ""
    stop(proc)  # as the newer version leaves the node before the rollback
    claims_dir = Path(dra.root, "plugins", "rdma.tke.cloud.tencent.com", "claims")
    record = claims_dir / f"{uid}.json"
    record.write_text(json.dumps(newer(json.loads(record.read_bytes()))))
    written = files(claims_dir), files(dra.cdi)
    start(dra)  # its start sweeps orphan specs: this one has a record, so it stays
    prepared = dra.prepare(uid, "nics")
    unprepared = unprepare(dra, uid, "nics")
    for answer in (prepared.error, unprepared):
        assert f"prepared-claim record {record} has schema 2" in answer, answer
        assert "roll forward to rdma-cni 0.2.0 or later" in answer, answer
    assert (files(claims_dir), files(dra.cdi)) == written
