"""A record write cut short by a kill leaves its temp file; the driver's start removes it and keeps
every record."""

from __future__ import annotations

from pathlib import Path

from rdma_cni.dra.prepared import PREPARED, PreparedClaim, PreparedClaims

UID = "0b0e8a4e-6d1f-4a9b-9f0e-3c2d1b0a9f8e"


def test_the_start_sweep_removes_cut_short_writes_and_keeps_the_records(tmp_path: Path) -> None:
    recs = PreparedClaims(str(tmp_path / "claims"))
    recs.put(PreparedClaim(UID, "default", "c", PREPARED, ()))
    cut = tmp_path / "claims" / ".tmp-k1ll3d"
    cut.write_text('{"uid": "')
    assert recs.sweep_temp() == [str(cut)]
    assert not cut.exists() and recs.uids() == [UID] and recs.get(UID) is not None
    assert recs.sweep_temp() == []
    assert PreparedClaims(str(tmp_path / "none")).sweep_temp() == []
