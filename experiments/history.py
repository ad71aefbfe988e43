"""A run's `history.csv`: one row per finished epoch, in the columns Keras' CSVLogger uses.

Read by the queue (time left), the pilots, the report and the evaluation, most
of which must not wait for Keras, so this module imports none: the writer,
a Keras callback, is `checkpoints.HistoryWriter`.
"""

import csv
import io
from pathlib import Path

from experiments import atomic


class HistoryError(ValueError):
    """A history.csv that does not read, or lacks an epoch's row, named in one line."""


def read_history(path, epochs=0):
    """The rows of a history CSV as dicts ([] when missing), each checked; HistoryError for the first that is
    not an epoch's row, or when any of the first `epochs` epochs (0-based) has no row.

    A row reads when every cell is there, "epoch" is an integer and every other cell a number ("epoch_seconds"
    among them), empty only in a validation column (an epoch without validation). The run writes every row
    before the backup of its epoch (`checkpoints`), so a resumed run always has them; a hand edit or a damaged
    disk may not, and the readers (the resume, the report, the queue's forecast, the pilots) turned that into
    a traceback, or resumed over missing rows into a run whose history lacked them, which then counted as
    unfinished and trained again from the start.
    """
    path, rows = Path(path), []
    if path.is_file():
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
        except (csv.Error, ValueError) as error:
            raise HistoryError(f"{path} does not read as CSV ({error})") from None
    for line, row in enumerate(rows, start=2):
        if not _reads(row):
            raise HistoryError(f"{path}, line {line}, is no epoch's row")
    missing = sorted(set(range(epochs)) - {int(row["epoch"]) for row in rows})
    if missing:
        raise HistoryError(f"{path} has no row with epoch {', '.join(map(str, missing))} (0-based), of the "
                           f"{epochs} epochs the backup has seen")
    return rows


def _reads(row):
    if None in row or None in row.values():  # csv.DictReader's marks of too few or too many cells
        return False
    try:
        int(row["epoch"]), float(row["epoch_seconds"])
        for key, cell in row.items():
            if key != "epoch" and (cell or not key.startswith("val_")):
                float(cell)
    except (KeyError, ValueError):
        return False
    return True


def validation_curve(rows):
    """(epochs, val_accuracy) of `read_history`'s rows; 1-based epochs, epochs without validation left out."""
    rows = [row for row in rows if row.get("val_accuracy")]
    return [int(row["epoch"]) + 1 for row in rows], [float(row["val_accuracy"]) for row in rows]


def largest_fall(curve):
    """{"fall", "epoch"}: the deepest drop of a `validation_curve` below its best earlier epoch; None when empty.

    fall = max over epochs t of (max_{s <= t} acc_s) - acc_t, in accuracy units
    (0 for a curve that never drops below its best so far), and the 1-based
    epoch t of that low (the first, on a tie). A run that collapses and
    recovers ends at a good accuracy; this keeps the collapse visible.
    """
    epochs, accuracies = curve
    best, fall, low = float("-inf"), 0.0, None
    for epoch, accuracy in zip(epochs, accuracies):
        best = max(best, accuracy)
        if low is None or best - accuracy > fall:
            fall, low = best - accuracy, epoch
    return None if low is None else {"fall": fall, "epoch": low}


def cut_history(path, epochs):
    """Keep the rows of epochs < `epochs` (atomically); return the best val_accuracy among them."""
    if not epochs:
        Path(path).unlink(missing_ok=True)  # unread: a damaged file is no reason not to start afresh
        return None
    rows = read_history(path)
    kept = [row for row in rows if int(row["epoch"]) < epochs]
    if len(kept) != len(rows):
        if kept:
            atomic.write_text(path, csv_text(list(kept[0]), kept))
        else:
            Path(path).unlink()
    return max((float(row["val_accuracy"]) for row in kept), default=None)


def csv_text(fields, rows):
    """`rows` (dicts) as CSV text with a header of `fields`; keys outside `fields` are dropped."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
