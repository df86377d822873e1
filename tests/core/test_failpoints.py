"""The failpoints' arming file: a failpoint named in the env fires only while its file exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdma_cni.failpoints import Failpoints


def test_an_armed_failpoint_fires_only_while_its_file_exists(tmp_path: Path) -> None:
    armed = tmp_path / "armed"
    fp = Failpoints({"RDMA_CNI_FAILPOINT": "step:error", "RDMA_CNI_FAILPOINT_ARMED": str(armed)})
    fp.hit("step")  # not armed: nothing
    armed.touch()
    with pytest.raises(OSError, match="injected failure at step"):
        Failpoints({"RDMA_CNI_FAILPOINT": "step:error", "RDMA_CNI_FAILPOINT_ARMED": str(armed)}).hit("step")
    armed.unlink()
    fp.hit("step")


def test_without_an_arming_file_the_failpoint_fires_as_before() -> None:
    fp = Failpoints({"RDMA_CNI_FAILPOINT": "step#2:error"})
    fp.hit("other")
    fp.hit("step")
    with pytest.raises(OSError):
        fp.hit("step")
