"""Transparent huge pages for XLA's buffers on a Linux CPU: the project's commands restart themselves with glibc's tunable.

JAX's CPU client allocates each large buffer of a compiled step anew with
glibc's malloc, which maps it fresh from the kernel and unmaps it when freed,
so every step faults its buffers in 4 KiB page by page (``getrusage``'s
minor faults: about one per 4 KiB of a large output, every call). With
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` malloc asks the kernel for huge
pages (``madvise``). On the 2-core EPYC (glibc 2.36, transparent huge pages
in the kernel's default ``madvise`` mode) training the `small` ViT went
1.54-1.62x faster on JAX and 0.94-1.01x on TensorFlow, whose allocator keeps
its buffers (`python -m profiles.engine --compare-huge-pages`,
profiles/results/cpu-epyc-2core/engine-huge-pages.json).

glibc reads its tunables only when a process starts, so `restart_if_useful`
re-executes the running command (``os.execve``: the same process id, argv
and environment, plus the tunable) before the backend starts
(`experiments.cli.start_backend` calls it first). It does so only for the
project's own commands (``train.py``, ``evaluate.py``, ``python -m
experiments...``, ``profiles...``, ``tuning...``), never for a test runner, a
notebook or a user's script that imports the harness, and only where the
tunable can act: Linux with glibc 2.35 or newer and the kernel's huge pages
in ``madvise`` mode (with ``always`` every large mapping already gets them,
with ``never`` none can). ``PERFORMER_HUGE_PAGES=0`` keeps a command as
started; child processes inherit the setting through the environment.
"""

import os
import platform
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
TUNABLES_VARIABLE = "GLIBC_TUNABLES"
OPT_OUT_VARIABLE = "PERFORMER_HUGE_PAGES"
KERNEL_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MINIMUM_GLIBC = (2, 35)  # the first glibc with the hugetlb tunable
REPO = Path(__file__).resolve().parent.parent
ENTRY_PACKAGES = ("experiments", "profiles", "tuning")
ENTRY_SCRIPTS = ("train.py", "evaluate.py")


def tunables(environment):
    """The colon-separated settings of `environment`'s GLIBC_TUNABLES, in order."""
    return [item for item in environment.get(TUNABLES_VARIABLE, "").split(":") if item]


def with_tunable(environment):
    """A copy of `environment` whose GLIBC_TUNABLES holds the tunable (other tunables kept)."""
    items = tunables(environment)
    return {**environment, TUNABLES_VARIABLE: ":".join(items if TUNABLE in items else [*items, TUNABLE])}


def without_tunable(environment):
    """A copy of `environment` without the tunable, and opted out so that no command adds it back."""
    others = [item for item in tunables(environment) if item != TUNABLE]
    copy = {name: value for name, value in environment.items() if name != TUNABLES_VARIABLE}
    return {**copy, **({TUNABLES_VARIABLE: ":".join(others)} if others else {}), OPT_OUT_VARIABLE: "0"}


def has_tunable(environment):
    return TUNABLE in tunables(environment)


def tunable_can_act(libc=None, kernel_setting=None):
    """Whether glibc knows the tunable and the kernel gives huge pages only where asked (``madvise``)."""
    name, version = libc or platform.libc_ver()
    if sys.platform != "linux" or name != "glibc":
        return False
    try:
        if tuple(int(part) for part in version.split(".")[:2]) < MINIMUM_GLIBC:
            return False
        setting = kernel_setting if kernel_setting is not None else KERNEL_SETTING.read_text()
    except (ValueError, OSError):
        return False
    return "[madvise]" in setting


def running_a_project_command(main_module=None):
    """Whether this process runs one of the project's commands (not pytest, a notebook or a user's script)."""
    main_module = main_module or sys.modules.get("__main__")
    spec = getattr(main_module, "__spec__", None)
    if spec is not None:
        return spec.name.split(".")[0] in ENTRY_PACKAGES
    file = getattr(main_module, "__file__", None)
    return file is not None and Path(file).resolve() in {REPO / script for script in ENTRY_SCRIPTS}


def restart_if_useful():
    """Re-execute this command with the tunable where it helps and is not set yet (module docstring)."""
    if (os.environ.get(OPT_OUT_VARIABLE) == "0" or has_tunable(os.environ) or not running_a_project_command()
            or not tunable_can_act()):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, with_tunable(os.environ))
