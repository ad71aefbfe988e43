"""Measurements in child processes under a time and a memory limit, talking to the parent in events.

A measurement that runs out of memory or time is recorded as "oom" or
"timeout" and the sweep goes on, instead of taking the machine (or a
neighbour's process) down with it.
"""

import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from profiles.memory import proc_status_bytes

REPO = Path(__file__).resolve().parent.parent
# Children talk to the parent in lines with this prefix; everything else they
# print (TensorFlow's logs) is ignored.
EVENT_PREFIX = "PROFILE-JSON "
DEFAULT_MEMORY_LIMIT = 8 * 2**30
_POLL_SECONDS = 0.05


def run_in_child(module, task, time_limit_s, memory_limit_bytes=DEFAULT_MEMORY_LIMIT, on_event=None, env=None):
    """Run `python -m module TASK_JSON` under a time and a memory limit.

    The child prints one `EVENT_PREFIX {json}` line per event; each is passed
    to `on_event` as a dict. The time limit counts from the last event, so a
    child doing several measurements has `time_limit_s` for each. The memory
    limit caps the child's resident set, polled every 50 ms: on a shared
    machine this stops a runaway measurement before the kernel's OOM killer
    picks a process, possibly someone else's.

    Returns: (status, detail). status is "ok" when the child exited normally,
    "timeout" or "oom" when it was stopped here (or killed by the kernel's
    OOM killer), "error" otherwise with the last line of its stderr.
    """
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # so JAX's peak is what it used
    with tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen([sys.executable, "-m", module, json.dumps(task)], stdout=subprocess.PIPE,
                                 stderr=stderr, text=True, env=env, cwd=REPO)
        events = queue.Queue()
        reader = threading.Thread(target=_read_events, args=(child.stdout, events), daemon=True)
        reader.start()
        status, detail, finished = None, None, False
        deadline = time.monotonic() + time_limit_s
        while not finished:
            try:
                event = events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                event = {}
            if event is None:
                finished = True
            elif event:
                deadline = time.monotonic() + time_limit_s
                if on_event:
                    on_event(event)
            elif time.monotonic() > deadline:
                status, detail = "timeout", f"no result within {time_limit_s:g} s"
            elif proc_status_bytes("VmRSS", child.pid) > memory_limit_bytes:
                status, detail = "oom", f"resident memory over the {memory_limit_bytes / 2**30:g} GiB limit"
            if status:
                child.kill()
                break
        child.wait()
        reader.join(timeout=5)
        if status:
            return status, detail
        if child.returncode == -9:
            return "oom", "killed by SIGKILL (the kernel's OOM killer)"
        if child.returncode:
            stderr.seek(0)
            return "error", _last_error_line(stderr.read()) or f"exit status {child.returncode}"
    return "ok", None


def _read_events(stream, events):
    for line in stream:
        if line.startswith(EVENT_PREFIX):
            events.put(json.loads(line[len(EVENT_PREFIX):]))
    events.put(None)


def _last_error_line(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"\w+(\.\w+)*(Error|Exception|Exhausted)\b", line)]
    return (errors or lines or [None])[-1]


def emit(event):
    """Send one event from a child to the parent (see `run_in_child`)."""
    print(EVENT_PREFIX + json.dumps(event), flush=True)


_progress_hook = None


def report_progress_as_events():
    """In a child: make `progress` send an event, which also restarts the parent's time limit."""
    global _progress_hook
    _progress_hook = lambda stage: emit({"event": "progress", "stage": stage})


def progress(stage):
    """Tell a watching parent that a long measurement is still making progress."""
    if _progress_hook:
        _progress_hook(stage)


def failure(err):
    """(status, detail) of an exception raised by a measurement."""
    text = f"{type(err).__name__}: {err}"
    if isinstance(err, MemoryError) or re.search(r"RESOURCE_EXHAUSTED|ResourceExhausted|out of memory", text, re.I):
        return "oom", text.splitlines()[0][:300]
    return "error", text.splitlines()[0][:300]
