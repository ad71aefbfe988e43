"""history.csv readers: the validation curve and its largest fall, by hand."""

import pytest

from experiments.history import largest_fall, validation_curve


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
