"""Atomic file writes: a kill at any instant leaves the old file or the new one, never a mix.

Every file the tools write goes through `replacing(path)`: the content is
written to a temporary file in the same folder (same file system, so the
final `os.replace` is a single atomic rename on POSIX and Windows), and only a
complete file is renamed over `path`. A kill before the rename leaves the old
file untouched and a stray temporary file, which the next successful write of
the same path removes. (Power loss would also need an fsync; a killed process
cannot lose what it already handed to the kernel, and that is the failure the
study's long queues meet.)

    with replacing(out / "best.keras") as tmp:
        model.save(tmp)                       # a kill here leaves the old best.keras
    write_json(out / "metrics.json", metrics)

`read_json_object` reads such a JSON record back, refusing one that a hand or a disk has damaged.
"""

import collections
import contextlib
import json
import os
import time
from pathlib import Path

# The temporary file keeps the target's suffix: Keras and matplotlib choose the
# format from it (`.keras`, `.weights.h5`, `.png`).
_TMP_PREFIX = ".tmp-"
# Kill tests need to stop a writer at a chosen instant: with
# PERFORMER_KERAS_PAUSE_AT="best.keras:2" the second write of best.keras
# stops after its temporary file is complete and before the rename, announces
# itself in PERFORMER_KERAS_PAUSE_AT's "<tmp>.paused" file and waits to be
# killed. Unset (always, outside tests/test_kill.py), it costs one lookup.
PAUSE_VARIABLE = "PERFORMER_KERAS_PAUSE_AT"
_writes = collections.Counter()


def temporary_path(path):
    """The temporary sibling of `path` that `replacing` writes to (one per process)."""
    path = Path(path)
    return path.with_name(f"{_TMP_PREFIX}{os.getpid()}-{path.name}")


@contextlib.contextmanager
def replacing(path):
    """Yield a temporary path; on a clean exit rename it over `path`, on an error remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f"{_TMP_PREFIX}*-{path.name}*"):
        stale.unlink(missing_ok=True)  # left by a killed writer (and its pause marker)
    tmp = temporary_path(path)
    try:
        yield tmp
        _pause_if_asked(path, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _pause_if_asked(path, tmp):
    wanted = os.environ.get(PAUSE_VARIABLE)
    if not wanted:
        return
    _writes[path.name] += 1
    name, _, count = wanted.rpartition(":")
    if name == path.name and int(count) == _writes[path.name]:
        Path(f"{tmp}.paused").touch()
        while True:
            time.sleep(1)


def paused_under(folder):
    """True once a write under `folder` waits at PERFORMER_KERAS_PAUSE_AT (its marker exists).

    os.walk, not Path.rglob: a run removes its backup folder when training ends,
    and rglob raises FileNotFoundError for a folder that vanishes mid-scan
    where os.walk skips it.
    """
    return any(name.endswith(".paused") for _, _, files in os.walk(folder) for name in files)


def write_text(path, text):
    """Write `text` to `path` atomically."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def write_json(path, value, indent=2, sort_keys=True):
    """Write `value` as JSON to `path` atomically."""
    write_text(path, json.dumps(value, indent=indent, sort_keys=sort_keys) + "\n")


# What rendering a record that reads as a JSON object but lacks keys, or holds the wrong types, raises: a hand
# edit or other code, not this module's writes. Readers render to find out, and refuse such records in one line.
MALFORMED = (KeyError, TypeError, AttributeError, IndexError, ValueError)


def read_json_object(path):
    """The JSON object (a dict) that `write_json` wrote to `path`; ValueError naming the file if it is something else.

    A kill never leaves such a file half-written, but a hand edit or a damaged disk can, and a list or a
    number there failed later in `.get` with a traceback.
    """
    try:
        value = json.loads(Path(path).read_text())
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def save_figure(figure, path, **kwargs):
    """`figure.savefig(path)` atomically."""
    with replacing(path) as tmp:
        figure.savefig(tmp, **kwargs)
