"""The quality of a model's test predictions, and of its training curve, as plain numbers.

Pure numpy (no Keras), so every formula is tested by hand on tiny
examples (`tests/test_evaluation.py`).
"""

import math
import statistics
from pathlib import Path

import numpy as np

from experiments import atomic

# A class whose probability underflowed to 0 (float32 softmax) would make the
# log-likelihood -inf and AIC/BIC useless; one such confident mistake counts
# log(1e-12) ~ -27.6 instead.
PROBABILITY_FLOOR = 1e-12
ACCURACY_THRESHOLDS = (0.90, 0.95, 0.99)
# Equal-width confidence bins of the expected calibration error (Guo et al. 2017, arXiv 1706.04599).
CALIBRATION_BINS = 15
# Keras logs float32 accuracies: 450/500 arrives as 0.8999999761581421.
_FLOAT32_SLACK = 1e-6


def read_metrics(folder):
    """A finished run's metrics.json as a dict; None where it is missing or cannot be read.

    It is the run's last write, and atomic (`atomic.write_json`), so an
    unreadable one was damaged later (an edit, a disk): the run then counts as
    unfinished everywhere, and its command, run again, measures it again
    without training (`training.training_finished`).
    """
    try:
        return atomic.read_json_object(Path(folder) / "metrics.json")
    except (OSError, ValueError):
        return None


def classification_metrics(labels, probabilities, num_params, label_names=None):
    """Accuracy, per-class and macro precision/recall/F1, confusion, logL, AIC, BIC.

    Pure numpy. With predictions argmax_c p(c|x) and C[t, p] the number of
    test examples of true class t predicted as p:

        precision_c = C[c, c] / sum_t C[t, c]   (0 when c is never predicted)
        recall_c    = C[c, c] / sum_p C[c, p]   (0 when c has no test example)
        f1_c        = 2 P R / (P + R)           (0 when P + R = 0)
        macro_*     = unweighted mean over all model classes
        logL        = sum_i log max(p(y_i | x_i), 1e-12)
        nll_per_image = -logL / n (nats)
        ECE = sum_b (n_b / n) |accuracy_b - mean confidence_b|
        AIC = 2k - 2 logL,   BIC = k ln(n) - 2 logL

    The ECE bins the confidence max_c p(c|x) into `CALIBRATION_BINS` equal
    intervals (lo, hi]. NLL and ECE are the fit measures to read: here k is
    about 2 x 10^4 to 10^6 against -2 logL of a few thousand, so AIC and BIC
    are almost all parameter term and rank models by their size.

    with k = `num_params` (trainable parameters) and n test examples. The
    floor of 1e-12 keeps logL finite when a float32 probability underflows
    to 0 (see `PROBABILITY_FLOOR`).

    Args:
        labels: (n,) integer classes in [0, num_classes).
        probabilities: (n, num_classes) class probabilities.
        num_params: k, or None (then aic and bic are None).
        label_names: optional names; per_class entries use the index otherwise.

    Returns: dict with test_accuracy, macro_precision, macro_recall, macro_f1,
    per_class (list of {"class", "precision", "recall", "f1", "support"}),
    confusion_matrix (list of lists, rows = true class), log_likelihood, aic,
    test_examples, nll_per_image, expected_calibration_error, bic; plain
    Python numbers.
    """
    labels = np.asarray(labels)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.ndim != 2 or labels.shape != probabilities.shape[:1] or len(labels) == 0:
        raise ValueError(
            f"Need labels (n,) and probabilities (n, classes) with n > 0, got "
            f"{labels.shape} and {probabilities.shape}"
        )
    num_examples, num_classes = probabilities.shape
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"labels must be integers in [0, {num_classes}), got {labels.dtype} values")
    if label_names is not None and len(label_names) != num_classes:
        raise ValueError(f"{len(label_names)} label names for {num_classes} classes")

    predictions = probabilities.argmax(axis=1)
    confusion = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    hits = np.diag(confusion).astype(np.float64)
    predicted, support = confusion.sum(axis=0), confusion.sum(axis=1)
    precision = np.divide(hits, predicted, out=np.zeros(num_classes), where=predicted > 0)
    recall = np.divide(hits, support, out=np.zeros(num_classes), where=support > 0)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros(num_classes), where=both > 0)

    chosen = probabilities[np.arange(num_examples), labels]
    log_likelihood = float(np.sum(np.log(np.clip(chosen, PROBABILITY_FLOOR, 1.0))))
    confidence = probabilities.max(axis=1)
    bins = np.clip(np.ceil(confidence * CALIBRATION_BINS).astype(int) - 1, 0, CALIBRATION_BINS - 1)
    correct = (predictions == labels).astype(np.float64)
    calibration_error = sum(
        abs(correct[bins == b].sum() - confidence[bins == b].sum()) for b in range(CALIBRATION_BINS)
    ) / num_examples
    names = range(num_classes) if label_names is None else label_names
    return {
        "test_accuracy": float(hits.sum() / num_examples),
        "macro_precision": float(precision.mean()),
        "macro_recall": float(recall.mean()),
        "macro_f1": float(f1.mean()),
        "per_class": [
            {"class": name, "precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for name, p, r, f, s in zip(names, precision, recall, f1, support)
        ],
        "confusion_matrix": confusion.tolist(),
        "test_examples": int(num_examples),
        "log_likelihood": log_likelihood,
        "nll_per_image": -log_likelihood / num_examples,
        "expected_calibration_error": float(calibration_error),
        "aic": None if num_params is None else 2 * num_params - 2 * log_likelihood,
        "bic": None if num_params is None else num_params * math.log(num_examples) - 2 * log_likelihood,
    }


def history_metrics(rows):
    """Training cost and speed of convergence from the rows of a run's history.csv (`history.read_history`).

    Returns a dict:
        train_seconds_per_epoch: median of the `epoch_seconds` column (the
            median, so the first epoch's tracing does not weigh in).
        epochs_to_90, epochs_to_95, epochs_to_99: the 1-based number of the
            first epoch whose val_accuracy reaches 0.90 / 0.95 / 0.99, None
            if none does. The number is the logged 0-based `epoch` plus one,
            so a resumed run that repeats an epoch still counts right.
    Every value is None when there are no rows.
    """
    seconds = [float(row["epoch_seconds"]) for row in rows]
    result = {"train_seconds_per_epoch": statistics.median(seconds) if seconds else None}
    for threshold in ACCURACY_THRESHOLDS:
        result[_threshold_key(threshold)] = next(
            (
                int(row["epoch"]) + 1
                for row in rows
                if row.get("val_accuracy") and float(row["val_accuracy"]) >= threshold - _FLOAT32_SLACK
            ),
            None,
        )
    return result


def _threshold_key(threshold):
    return f"epochs_to_{round(threshold * 100)}"


def format_table(metrics):
    """A plain-text table of a metrics dict: scalars, then one row per class."""
    scalars = [(key, value) for key, value in metrics.items() if key not in ("per_class", "confusion_matrix")]
    width = max(len(key) for key, _ in scalars)
    lines = [f"{key:<{width}}  {_format_value(value)}" for key, value in scalars]
    per_class = metrics.get("per_class") or []
    if per_class:
        lines += ["", f"{'class':<12}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}"]
        lines += [
            f"{str(row['class']):<12}{row['precision']:>10.4f}{row['recall']:>10.4f}{row['f1']:>10.4f}{row['support']:>10}"
            for row in per_class
        ]
    return "\n".join(lines)


def _format_value(value):
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"
