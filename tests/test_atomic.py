"""The pause marker that tests/test_kill.py waits for, found while the run changes its folders."""

import os
import shutil

from experiments import atomic


def test_paused_under_finds_a_marker_in_a_subfolder(tmp_path):
    (tmp_path / "backup").mkdir()
    assert not atomic.paused_under(tmp_path)
    (tmp_path / "backup" / ".tmp-1-state.json.paused").touch()
    assert atomic.paused_under(tmp_path)


def test_paused_under_is_false_for_a_folder_not_made_yet(tmp_path):
    assert not atomic.paused_under(tmp_path / "run")


def test_paused_under_skips_a_folder_removed_while_it_looks(tmp_path, monkeypatch):
    # A run removes backup/ at the end of training, between the listing of the run folder and
    # the scan of backup/, before its last writes: the moment that made Path.rglob raise
    # FileNotFoundError in CI. No marker yet, so the answer is False, not an error.
    (tmp_path / "backup").mkdir()
    scandir = os.scandir

    def scandir_then_remove_backup(path):
        if isinstance(path, int) or os.fspath(path) != os.fspath(tmp_path):  # rmtree scans by descriptor
            return scandir(path)
        entries = list(scandir(path))
        shutil.rmtree(tmp_path / "backup")
        return _Listing(entries)

    monkeypatch.setattr(os, "scandir", scandir_then_remove_backup)
    assert not atomic.paused_under(tmp_path)
    assert not (tmp_path / "backup").exists()


class _Listing:
    """A finished scandir, as os.walk and pathlib use one: an iterator and a context manager."""

    def __init__(self, entries):
        self._entries = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._entries)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
