"""rdma_cni.kube.dirwatch on a real directory with the real kernel's inotify: what ends a wait.

Every wait below either ends because something happened (True) or because its time ran out (False);
the tests assert which, never how long it took. The waits that must be woken are given a fallback of
10 s, so only an inotify event (or a wake) can end them with True.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rdma_cni.kube.dirwatch import ENV_SWITCH, DirWatch

LONG = 10.0


def later(action: Callable[[], object], delay: float = 0.1) -> threading.Thread:
    t = threading.Thread(target=lambda: (threading.Event().wait(delay), action()))
    t.start()
    return t


def serve_socket(path: Path) -> socket.socket:
    """A unix socket file bound at ``path`` (as kubelet's and the plugins' are)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    return s


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[DirWatch]:
    with DirWatch(str(tmp_path), fallback_s=LONG) as w:
        assert w.watching, w.why_polling  # in place from the start
        assert w.wait(0) is False  # nothing queued
        yield w


def test_a_socket_created_then_deleted_in_the_directory_each_end_a_wait(
    watch: DirWatch, tmp_path: Path
) -> None:
    sock_path = tmp_path / "kubelet.sock"
    made: list[socket.socket] = []
    t = later(lambda: made.append(serve_socket(sock_path)))
    assert watch.wait(LONG) is True  # the create woke it; a poll would have slept the 10 s out
    t.join()
    t = later(sock_path.unlink)
    assert watch.wait(LONG) is True  # and the delete
    t.join()
    made[0].close()
    assert watch.wait(0.05) is False  # nothing queued any more: the events were drained
    assert watch.watching


def test_a_rename_into_the_directory_ends_a_wait(watch: DirWatch, tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-staged"
    outside.write_text("x")
    t = later(lambda: os.rename(outside, tmp_path / "moved-in"))
    assert watch.wait(LONG) is True
    t.join()


def test_a_file_changed_in_place_does_not_end_a_wait(watch: DirWatch, tmp_path: Path) -> None:
    """Only entries coming and going matter (a socket's inode is what the caller compares)."""
    f = tmp_path / "kubelet_internal_checkpoint"
    f.write_text("{}")
    assert watch.wait(LONG) is True  # its creation
    f.write_text('{"Data": {}}')
    assert watch.wait(0.2) is False


def test_wake_from_another_thread_ends_a_wait(watch: DirWatch) -> None:
    t = later(watch.wake)
    assert watch.wait(LONG) is True
    t.join()
    assert watch.wait(0.05) is False  # one wake, one wait


def test_the_directory_removed_and_made_again_is_watched_again(tmp_path: Path) -> None:
    d = tmp_path / "device-plugins"
    d.mkdir()
    with DirWatch(str(d), fallback_s=0.05) as w:
        assert w.watching and w.wait(0) is False
        d.rmdir()
        assert w.wait(LONG) is True and not w.watching  # the kernel ended the watch with the directory
        assert w.wait(LONG) is False and "No such file" in w.why_polling  # a poll period until it is back
        d.mkdir()
        assert w.wait(LONG) is True and w.watching  # watched again: look at once (no event came for it)
        assert w.wait(0) is False
        t = later(lambda: (d / "kubelet.sock").write_text(""))
        assert w.wait(LONG) is True
        t.join()


def test_a_directory_that_does_not_exist_yet_is_polled_until_it_does(tmp_path: Path) -> None:
    d = tmp_path / "not-yet"
    with DirWatch(str(d), fallback_s=0.05) as w:
        assert w.wait(LONG) is False and not w.watching
        d.mkdir()
        assert w.wait(LONG) is True and w.watching


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_without_inotify_every_wait_is_one_poll_period_and_wake_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "environment":
        monkeypatch.setenv(ENV_SWITCH, "off")
    with DirWatch(str(tmp_path), fallback_s=0.05, inotify=how != "argument") as w:
        (tmp_path / "kubelet.sock").write_text("")
        assert w.wait(LONG) is False and not w.watching  # the caller looks again after 50 ms
        assert (ENV_SWITCH in w.why_polling) == (how == "environment"), w.why_polling
        w.wake()
        assert w.wait(LONG) is True


def test_wake_after_close_is_harmless(tmp_path: Path) -> None:
    w = DirWatch(str(tmp_path), fallback_s=0.05)
    w.close()
    w.wake()
    w.close()
