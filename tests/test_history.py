"""history.csv readers: the validation curve and its largest fall, by hand, and the refusal of a damaged file."""

import pytest

from experiments.history import HistoryError, largest_fall, read_history, validation_curve


@pytest.mark.parametrize("accuracies, fall, epoch", [
    ([0.90, 0.42, 0.95, 0.97], 0.48, 2),  # collapses after the warm-up epoch, recovers: the final accuracy hides it
    ([0.50, 0.80, 0.70, 0.95, 0.60], 0.35, 5),  # measured from the best before it (0.95), not from the epoch before
    ([0.75, 0.5, 1.0, 0.75], 0.25, 2),  # two falls of exactly 0.25 (binary fractions): the first counts
    ([0.10, 0.20, 0.30], 0.0, 1),  # never below its best so far
    ([0.70], 0.0, 1),
])
def test_largest_fall_is_the_deepest_drop_below_the_best_earlier_epoch(accuracies, fall, epoch):
    result = largest_fall((list(range(1, len(accuracies) + 1)), accuracies))
    assert result["fall"] == pytest.approx(fall) and result["epoch"] == epoch


def test_largest_fall_reads_the_epochs_of_the_csv_and_skips_rows_without_validation():
    rows = [{"epoch": "0", "val_accuracy": "0.9"}, {"epoch": "1", "val_accuracy": ""},
            {"epoch": "2", "val_accuracy": "0.6"}, {"epoch": "3", "val_accuracy": "0.95"}]
    assert largest_fall(validation_curve(rows)) == {"fall": pytest.approx(0.3), "epoch": 3}
    assert largest_fall(validation_curve([])) is None


HEADER = "epoch,accuracy,epoch_seconds,val_accuracy\n"


@pytest.mark.parametrize("text, epochs, problem", [
    (HEADER + "0,0.5,9,0.6\n1,0.7,9,0.8\n2,0.8,9,0.9\n", 2, None),  # the row of an epoch the backup has not seen is cut later
    (HEADER + "0,0.5,9,0.6\n1,0.7,9,\n", 2, None),  # an epoch without validation
    (HEADER + "0,0.5,9,0.6\n1,0.7,9,0.8\n", 3, "has no row with epoch 2 (0-based), of the 3 epochs"),
    (HEADER + "1,0.7,9,0.8\n", 2, "has no row with epoch 0 (0-based)"),
    (HEADER + "0,0.5,9,0.6\nx,0.7,9,0.8\n", 2, "line 3, is no epoch's row"),
    (HEADER + "0,0.5,9,0.6\n1,0.7,9,abc\n", 2, "line 3, is no epoch's row"),
    # Cells other than validation's are always written: the report, the pilots and the queue's forecast
    # ended in a traceback on one that did not read (could not convert string to float).
    (HEADER + "0,0.5,9,0.6\n1,0.7,abc,0.8\n", 2, "line 3, is no epoch's row"),
    (HEADER + "0,0.5,9,0.6\n1,0.7,,0.8\n", 2, "line 3, is no epoch's row"),
    (HEADER + "0,,9,0.6\n", 1, "line 2, is no epoch's row"),
    (HEADER + "0,0.5,9,0.6\n1\n", 2, "line 3, is no epoch's row"),  # a cut-off row: None for the missing cells
    (HEADER + "0,0.5,9,0.6\n1,0.7,9,0.8,9\n", 2, "line 3, is no epoch's row"),  # a cell too many
    ("accuracy,val_accuracy\n0.5,0.6\n", 1, "line 2, is no epoch's row"),
    (None, 1, "has no row with epoch 0 (0-based)"),  # no file
    (b"\xff\xfe\x00", 1, "does not read as CSV"),
    (HEADER + "2,0.5,9,0.6\n", 0, None),  # no epoch asked for: only whether the rows read
    (HEADER + "0,0.5,9,0.6\nx,0.7,9,0.8\n", 0, "line 3, is no epoch's row"),
])
def test_a_row_that_does_not_read_or_an_epoch_without_one_is_refused_in_one_line(tmp_path, text, epochs, problem):
    path = tmp_path / "history.csv"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    if problem is None:
        assert [row["epoch"] for row in read_history(path, epochs)] == [line.split(",")[0] for line in text.split()[1:]]
    else:
        with pytest.raises(HistoryError) as error:
            read_history(path, epochs)
        assert str(error.value).startswith(str(path)) and problem in str(error.value) and "\n" not in str(error.value)
