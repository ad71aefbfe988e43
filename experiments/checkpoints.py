"""Kill-safe training state: backups, the best checkpoint and the history, each written atomically.

Keras' own `BackupAndRestore`, `ModelCheckpoint` and `CSVLogger` write their
files in place, so a SIGKILL during a write leaves a cut-off HDF5 file that no
rerun can load, a half `best.keras`, or a half CSV row. The study's queues are
stopped and restarted many times, so these callbacks replace them:

* `KillSafeBackup` writes `backup/epoch<k>.weights.h5` (model, optimizer and
  seed-generator state) to a temporary file and renames it into place, then
  renames a new `backup/state.json` listing it first; the previous good state
  stays listed (and on disk) until the new one is complete. `restore` tries the
  listed states newest first and falls back, with one line, past any that does
  not load; a `state.json` that does not read (never a kill's doing) gives way,
  with one line, to the weights files beside it. With `keep_epochs`, the
  backups of those epochs are also copied
  (atomically, before `state.json` names them) into `epochs/`, which neither
  the rotation nor the run's end removes: the only weights of an early epoch
  that outlive the run (`experiments.favor_floor` measures them).
* `BestCheckpoint` saves `best.keras` atomically when validation accuracy
  improves on everything the restored history has seen.
* `HistoryWriter` rewrites `history.csv` atomically each epoch, so it always
  holds whole rows, one per epoch, in the columns CSVLogger uses (its readers
  are in `history`, which imports no Keras).

`history.csv` can hold one epoch more than the backup (a kill between the two
writes); after `restore` the trainer cuts it back (`history.cut_history`), so it
always ends at the epoch the restored state has seen.
"""

import json
import os
import re
import shutil
from pathlib import Path

import keras

from experiments import atomic
from experiments.history import csv_text, read_history

STATE_FILE = "state.json"
# Beside backup/ in the run folder: the epochs that `--keep-epochs` asked to keep.
KEPT_DIR = "epochs"
# The newest state and the one before it: a corrupt newest file costs one epoch.
KEPT_STATES = 2
_FINISHED_SUFFIX = ".finished"
_WEIGHTS_NAME = re.compile(r"epoch(\d{4,})\.weights\.h5")


def saved_states(backup_dir, log=None):
    """[{"epoch", "weights"}] of `backup_dir`, newest first; [] without a state file.

    A kill never leaves the state file unreadable (it is renamed into place whole), but a hand edit or
    a damaged disk can: its weights files are then taken from their names, newest first (each is whole
    too, and an epoch's weights are written after its history row), with one line to `log`, rather than
    training from the start and rotating the intact backups away.
    """
    path = Path(backup_dir) / STATE_FILE
    if not path.exists():
        return []
    try:
        states = json.loads(path.read_text())["states"]
        if isinstance(states, list) and all(
                isinstance(state, dict) and type(state.get("epoch")) is int and isinstance(state.get("weights"), str)
                for state in states):
            return states
        problem = "not a list of {epoch, weights}"
    except (OSError, ValueError, KeyError, TypeError) as error:
        problem = _one_line(error)
    found = sorted(((int(match[1]), file.name) for file in Path(backup_dir).glob("epoch*.weights.h5")
                    if (match := _WEIGHTS_NAME.fullmatch(file.name))), reverse=True)
    if log is not None:
        log(f"{path} is unreadable ({problem}); trying the weights files beside it: "
            f"{', '.join(name for _, name in found) or 'none'}")
    return [{"epoch": epoch, "weights": name} for epoch, name in found]


def restore(build_model, backup_dir, log=print):
    """(model, epochs done): the newest backup that loads, else a fresh model.

    `build_model()` returns a new compiled model, seeded as the run was; it is
    called again for each attempt, so a file that fails halfway through
    loading never leaves half-restored weights behind.
    """
    states = saved_states(backup_dir, log)
    for index, state in enumerate(states):
        model = build_model()
        path = Path(backup_dir) / state["weights"]
        try:
            model.optimizer.build(model.trainable_variables)
            model.load_weights(path)
        except Exception as error:  # a truncated or foreign file: any failure means "not loadable"
            fallback = f"epoch {states[index + 1]['epoch']}" if index + 1 < len(states) else "the start"
            log(f"backup {path} does not load ({_one_line(error)}); falling back to {fallback}")
            continue
        return model, int(state["epoch"])
    return build_model(), 0


def _one_line(error, limit=160):
    """An exception as "Type: message" on one cut line: the type says what a bare KeyError('states') does not."""
    return " ".join(f"{type(error).__name__}: {error}".split())[:limit]


def weights_name(epoch):
    """The file name of the weights after `epoch` epochs (1-based), in backup/ and in epochs/ (`_WEIGHTS_NAME`)."""
    return f"epoch{epoch:04d}.weights.h5"


def missed_epochs(keep_epochs, epochs_done, kept_dir):
    """The epochs of `keep_epochs` that a run with `epochs_done` epochs has trained but not kept in `kept_dir`."""
    return sorted(k for k in set(keep_epochs) if k <= epochs_done and not (Path(kept_dir) / weights_name(k)).is_file())


def finish(backup_dir):
    """Remove the backup once training ended; a rename first, so a kill midway never leaves half a backup."""
    backup_dir = Path(backup_dir)
    finished = backup_dir.with_name(backup_dir.name + _FINISHED_SUFFIX)
    if backup_dir.exists():
        os.replace(backup_dir, finished)
    shutil.rmtree(finished, ignore_errors=True)


class KillSafeBackup(keras.callbacks.Callback):
    """Back the training state up at every epoch end, atomically (see the module docstring).

    Args:
        backup_dir: folder of the weights files and `state.json`.
        keep_epochs: epochs (1-based) whose backup is also copied into `kept_dir`.
        kept_dir: default `KEPT_DIR` beside `backup_dir`.
    """

    def __init__(self, backup_dir, keep_epochs=(), kept_dir=None):
        super().__init__()
        self.backup_dir = Path(backup_dir)
        self.keep_epochs = frozenset(keep_epochs)
        self.kept_dir = Path(kept_dir) if kept_dir is not None else self.backup_dir.parent / KEPT_DIR

    def on_epoch_end(self, epoch, logs=None):
        name = weights_name(epoch + 1)
        with atomic.replacing(self.backup_dir / name) as tmp:
            self.model.save_weights(tmp)
        if epoch + 1 in self.keep_epochs:
            # Before state.json names the backup: a kill in between retrains the epoch and copies it again.
            with atomic.replacing(self.kept_dir / name) as tmp:
                shutil.copyfile(self.backup_dir / name, tmp)
        states = [{"epoch": epoch + 1, "weights": name}]
        states += [s for s in saved_states(self.backup_dir) if s["weights"] != name][: KEPT_STATES - 1]
        atomic.write_json(self.backup_dir / STATE_FILE, {"states": states})
        kept = {s["weights"] for s in states}
        for old in self.backup_dir.glob("epoch*.weights.h5"):
            if old.name not in kept:
                old.unlink(missing_ok=True)

    def on_train_end(self, logs=None):
        finish(self.backup_dir)


class BestCheckpoint(keras.callbacks.Callback):
    """Save the whole model to `path` when `monitor` beats every value seen so far (max)."""

    def __init__(self, path, monitor="val_accuracy", best=None):
        super().__init__()
        self.path = Path(path)
        self.monitor = monitor
        self.best = best

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or (self.best is not None and not value > self.best):
            return
        self.best = float(value)
        with atomic.replacing(self.path) as tmp:
            self.model.save(tmp)


class HistoryWriter(keras.callbacks.Callback):
    """Append each epoch's logs to a CSV, rewriting the whole file atomically.

    Columns as Keras' CSVLogger: "epoch", then the log keys sorted.
    """

    def __init__(self, path):
        super().__init__()
        self.path = Path(path)

    def on_epoch_end(self, epoch, logs=None):
        rows = read_history(self.path)
        row = {"epoch": epoch, **{key: _cell(value) for key, value in sorted((logs or {}).items())}}
        fields = list(rows[0]) if rows else list(row)
        atomic.write_text(self.path, csv_text(fields, rows + [row]))


def _cell(value):
    return float(keras.ops.convert_to_numpy(value)) if not isinstance(value, str) else value
