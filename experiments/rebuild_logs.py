"""Rebuild the TensorBoard logs of finished run folders that lost them, from the folders' own records.

    python -m experiments.rebuild_logs results/cpu/runs/cifar10/softmax-absolute/seed0 ...

A run writes its event files while it trains; where those were lost (11 of
the `cpu` study's runs: the worktrees that trained them were removed before
the study kept its logs), the same curves are still in the folder:
`history.csv` holds every epoch's logged values, `metrics.json` the test
metrics and `config.json` the settings. This writes them as training writes
them (`logs/train`, `logs/validation`, `logs/test`, the HParams summary in
`logs/`), so `tensorboard --logdir results/cpu` shows every run, and leaves
`logs/REBUILT.txt` saying so: the wall times in these files are the rebuild's,
not the training's. A folder that already has `logs/`, or is not a finished
run, is refused, so nothing a run wrote itself is ever replaced.
"""

import datetime
import shutil
import sys
from pathlib import Path

from experiments import atomic
from experiments.cli import Distinct, fail, parser, start_backend

start_backend("rebuild_logs")  # before the imports below load Keras: drops TensorFlow's start-up log

from experiments.evaluation import log_test_metrics
from experiments.event_logs import EpochScalars
from experiments.history import read_history
from experiments.run_config import read_recorded
from experiments.training import log_hparams

REBUILT_NOTE = "REBUILT.txt"


class RebuildError(ValueError):
    """A folder whose logs cannot or must not be rebuilt."""


def check(folder):
    """(RunConfig, metrics, history rows) of `folder`; RebuildError unless it is a finished run folder without logs/."""
    folder = Path(folder)
    missing = [name for name in ("config.json", "history.csv", "metrics.json") if not (folder / name).is_file()]
    if missing:
        raise RebuildError(f"{folder} is not a finished run folder (no {', '.join(missing)})")
    if (folder / "logs").exists():
        raise RebuildError(f"{folder / 'logs'} exists; only a run without logs is rebuilt")
    try:  # a record damaged by hand or disk (HistoryError, RunError among them), each named with its file
        config = read_recorded(folder / "config.json")
        metrics = atomic.read_json_object(folder / "metrics.json")
        rows = read_history(folder / "history.csv")
    except ValueError as error:
        raise RebuildError(str(error)) from None
    if not rows:
        raise RebuildError(f"{folder / 'history.csv'} has no epochs")
    return config, metrics, rows


def rebuild(folder):
    """Write `folder`'s logs from history.csv, metrics.json and config.json; the number of epochs written.

    They are written to logs.partial/ (cleared first) and renamed to logs/
    once complete, so a kill midway leaves no logs/ that would be refused.
    """
    config, metrics, rows = check(folder)
    folder = Path(folder)
    logs = folder / "logs.partial"
    shutil.rmtree(logs, ignore_errors=True)
    # Training's own writers, fed each epoch's logs as history.csv kept them.
    curves = EpochScalars(logs)
    for row in rows:
        curves.on_epoch_end(int(row["epoch"]), {key: float(value) for key, value in row.items()
                                                if key != "epoch" and value not in ("", None)})
    curves.on_train_end()
    log_test_metrics(logs / "test", metrics, step=len(rows))
    log_hparams(logs, config)
    (logs / REBUILT_NOTE).write_text(
        f"Rebuilt on {datetime.date.today().isoformat()} by `python -m experiments.rebuild_logs {folder}` from this "
        "run's history.csv, metrics.json and config.json; the event files' wall times are the rebuild's.\n")
    logs.rename(folder / "logs")
    return len(rows)


def main(argv=None):
    cli = parser("rebuild_logs", __doc__)
    cli.add_argument("folders", nargs="+", action=Distinct, metavar="RUN_FOLDER", help="finished run folders without logs/")
    folders = cli.parse_args(argv).folders
    try:
        for folder in folders:  # all checked before any is written
            check(folder)
    except RebuildError as error:
        return fail("rebuild_logs", error)
    for folder in folders:
        epochs = rebuild(folder)
        print(f"rebuild_logs: {Path(folder) / 'logs'} ({epochs} epochs, test metrics, HParams)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
