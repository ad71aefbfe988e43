"""The project's commands restart themselves with glibc's huge-pages tunable where it can act (`experiments.huge_pages`)."""

import os
import sys
import types

import pytest

from experiments import huge_pages

MADVISE = "always [madvise] never\n"


def module(spec_name=None, file=None):
    fake = types.ModuleType("__main__")
    fake.__spec__ = types.SimpleNamespace(name=spec_name) if spec_name else None
    if file:
        fake.__file__ = str(file)
    return fake


def test_the_tunable_joins_the_others_once_and_leaves_alone():
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"}
    added = huge_pages.with_tunable(env)
    assert added == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "HOME": "/h"}
    assert huge_pages.with_tunable(added) == added and huge_pages.has_tunable(added) and not huge_pages.has_tunable(env)
    assert huge_pages.with_tunable({}) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"}  # copies, the input untouched
    assert huge_pages.without_tunable(added) == dict(env, PERFORMER_HUGE_PAGES="0")
    assert huge_pages.without_tunable(huge_pages.with_tunable({})) == {"PERFORMER_HUGE_PAGES": "0"}


@pytest.mark.parametrize("libc, setting, platform, acts", [
    (("glibc", "2.36"), MADVISE, "linux", True),
    (("glibc", "2.35"), MADVISE, "linux", True),
    (("glibc", "2.34"), MADVISE, "linux", False),  # glibc without the tunable
    (("glibc", "2.36"), "[always] madvise never\n", "linux", False),  # every large mapping has them already
    (("glibc", "2.36"), "always madvise [never]\n", "linux", False),  # none can have them
    (("", ""), MADVISE, "linux", False),  # musl and others
    (("glibc", "2.36"), MADVISE, "darwin", False),
    (("glibc", "unknown"), MADVISE, "linux", False),
])
def test_the_tunable_acts_only_with_a_glibc_that_knows_it_and_huge_pages_on_request(monkeypatch, libc, setting,
                                                                                     platform, acts):
    monkeypatch.setattr(sys, "platform", platform)
    assert huge_pages.tunable_can_act(libc, setting) is acts


def test_a_kernel_without_the_setting_file_is_one_where_it_cannot_act(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(huge_pages, "KERNEL_SETTING", tmp_path / "absent")
    assert not huge_pages.tunable_can_act(("glibc", "2.36"))


@pytest.mark.parametrize("main, ours", [
    (module("experiments.benchmark"), True),
    (module("profiles.engine"), True),
    (module("profiles"), True),
    (module("tuning.sweep"), True),
    (module(file=huge_pages.REPO / "train.py"), True),
    (module(file=huge_pages.REPO / "evaluate.py"), True),
    (module("pytest"), False),  # python -m pytest
    (module(file=huge_pages.REPO / ".venv" / "bin" / "pytest"), False),
    (module(file="/home/someone/my_training.py"), False),  # a user's script that imports the harness
    (module(), False),  # python -c, a notebook
])
def test_only_the_projects_own_commands_restart(main, ours):
    assert huge_pages.running_a_project_command(main) is ours


@pytest.fixture
def restart(monkeypatch):
    """restart_if_useful() as one of the project's commands where the tunable acts, with execve recorded."""
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    monkeypatch.setitem(sys.modules, "__main__", module("experiments.benchmark"))
    monkeypatch.setattr(huge_pages, "tunable_can_act", lambda: True)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("PERFORMER_HUGE_PAGES", raising=False)
    return calls


def test_a_command_restarts_itself_as_started_plus_the_tunable(restart, monkeypatch):
    monkeypatch.setenv("SOME_SETTING", "kept")
    huge_pages.restart_if_useful()
    ((path, argv, env),) = restart
    assert path == sys.executable and argv == sys.orig_argv
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and env["SOME_SETTING"] == "kept"
    assert {k: v for k, v in env.items() if k != "GLIBC_TUNABLES"} == dict(os.environ)


@pytest.mark.parametrize("variable, value", [("PERFORMER_HUGE_PAGES", "0"),
                                             ("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")])
def test_no_restart_when_opted_out_or_already_restarted(restart, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    huge_pages.restart_if_useful()
    assert restart == []


def test_no_restart_of_anything_but_a_project_command_or_where_the_tunable_cannot_act(restart, monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", module("pytest"))
    huge_pages.restart_if_useful()
    monkeypatch.setitem(sys.modules, "__main__", module("experiments.benchmark"))
    monkeypatch.setattr(huge_pages, "tunable_can_act", lambda: False)
    huge_pages.restart_if_useful()
    assert restart == []
