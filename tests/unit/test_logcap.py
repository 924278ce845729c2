"""`motor up`'s log cap (deploy/logcap.py): a log past its cap is cut in place, its older part
kept beside it, and the writer's next append starts the file again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deploy.logcap import LogCap, cap_once


@pytest.mark.parametrize(("size", "cut"), [(99, False), (100, False), (101, True)])
def test_a_log_is_cut_only_past_its_cap(tmp_path: Path, size: int, cut: bool) -> None:
    (tmp_path / "a.log").write_bytes(b"x" * size)
    assert bool(cap_once(tmp_path, LogCap(max_bytes=100))) is cut
    assert (tmp_path / "a.log.1").exists() is cut


def test_a_writer_that_keeps_its_descriptor_appends_at_the_new_start(tmp_path: Path) -> None:
    path = tmp_path / "nodeagent-n1.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # what motor up's children hold
    try:
        os.write(fd, b"old\n" * 50)
        cap = LogCap(max_bytes=100, keep=2)
        assert cap_once(tmp_path, cap) == [path]
        os.write(fd, b"new\n")
        assert path.read_bytes() == b"new\n"
        assert (tmp_path / "nodeagent-n1.log.1").read_bytes() == b"old\n" * 50
        os.write(fd, b"more\n" * 30)
        cap_once(tmp_path, cap)
        assert (tmp_path / "nodeagent-n1.log.2").read_bytes() == b"old\n" * 50  # shifted, kept
        assert (tmp_path / "nodeagent-n1.log.1").read_bytes().startswith(b"new\n")
        os.write(fd, b"x" * 200)
        cap_once(tmp_path, cap)  # beyond `keep`: the oldest goes
        assert not (tmp_path / "nodeagent-n1.log.3").exists()
        assert (tmp_path / "nodeagent-n1.log.2").read_bytes().startswith(b"new\n")
    finally:
        os.close(fd)


def test_older_copies_are_not_cut_again(tmp_path: Path) -> None:
    (tmp_path / "a.log.1").write_bytes(b"x" * 1000)
    assert cap_once(tmp_path, LogCap(max_bytes=10)) == []
