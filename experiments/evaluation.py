"""Test-set evaluation of a trained ViT: quality, information criteria and cost.

`evaluate` accepts what training leaves behind and writes one `metrics.json`
with exactly the keys of `METRIC_KEYS` (null where a value is unknown), plus a
confusion-matrix picture beside it:

* a run folder (``config.json``, ``best.keras``, ``history.csv`` and optionally
  an ``export/`` SavedModel, whose agreement with the Keras model is checked),
* a bare ``.keras`` file,
* a SavedModel folder (``saved_model.pb``) with a ``serve`` endpoint.

The parts live beside it: the metrics (`metrics.py`, pure numpy), latency and
device (`latency.py`), model loading (`models.py`) and the confusion-matrix
figure (`figures.py`). TensorFlow is allowed here: this is evaluation and
export code, not a layer.
"""

from pathlib import Path

import numpy as np

from experiments import atomic
from experiments.history import read_history
from experiments.data import load_dataset
from experiments.export import read_export_record
from experiments.figures import plot_confusion_matrix
from experiments.latency import LATENCY_REPEATS, device_name, measure_latency
from experiments.metrics import classification_metrics, history_metrics
from experiments.models import EvaluationError, load_keras_model, load_saved_model, predict_all
from experiments.run_config import read_recorded

METRIC_KEYS = (
    "variant", "attention", "position", "dataset", "seed",
    "test_accuracy", "macro_precision", "macro_recall", "macro_f1",
    "per_class", "confusion_matrix", "test_examples", "log_likelihood", "nll_per_image",
    "expected_calibration_error", "aic", "bic",
    "params", "flops_per_image",
    "train_seconds_per_epoch", "epochs_to_90", "epochs_to_95", "epochs_to_99",
    "latency_ms_batch1", "latency_ms_batch256", "device", "backend",
)
# Probabilities are float32: Keras and its SavedModel may differ by rounding.
EXPORT_TOLERANCE = 1e-4
# Test images per prediction call: large enough to amortise the call, small enough for any model.
PREDICT_BATCH = 256


def evaluate(path, dataset=None, limit=None, batch_size=None, out=None):
    """Evaluate a run folder, a `.keras` file or a SavedModel on a test split.

    Args:
        path: a run folder (has config.json and best.keras), a `.keras` file or
            a SavedModel folder (has saved_model.pb).
        dataset, limit: the test data (`data.load_dataset`); default from the
            run's config.json (for train.py's export, from its record of the
            run), required for a bare model. `limit="all"`: the whole test split.
        batch_size: batch of the test predictions (default `PREDICT_BATCH`).
        out: folder for metrics.json and confusion_matrix.png; default the run
            folder, else the folder holding the model. A run folder takes only
            its own run's evaluation on its own test split (`_check_out`).

    A run folder with an `export/` SavedModel also runs the export on the
    test set and writes export_agreement.json (max |p_keras - p_savedmodel|,
    both accuracies) beside metrics.json; an EvaluationError follows if the
    probabilities differ by more than `EXPORT_TOLERANCE`.

    Returns: the metrics dict, keys exactly `METRIC_KEYS`.

    Raises:
        EvaluationError: bad path, no dataset, data that does not fit the
            model, or an `out` that is a run folder this evaluation must not
            write into. data.DataError: the dataset cannot be loaded.
    """
    path = Path(path)
    kind = _path_kind(path)
    try:  # HistoryError, or a config.json that describes no run (RunError): a traceback, or accepted, once
        config = read_recorded(path / "config.json") if kind == "run" else None
        if kind == "saved_model":  # train.py's export names its run's settings (`export.EXPORT_RECORD`)
            config = read_export_record(path)[1]
        rows = read_history(path / "history.csv") if kind == "run" else []
    except ValueError as error:
        raise EvaluationError(str(error)) from None
    # The run's own test split: cut to its limit only if the run cut it (`limit_test`).
    own_dataset = config.dataset if config else None
    own_limit = config.limit if config and config.limit_test else None
    test_limit = own_limit if limit is None else (None if limit == "all" else limit)
    other_data = (dataset or own_dataset, test_limit) != (own_dataset, own_limit)
    dataset = dataset or own_dataset
    if dataset is None:
        raise EvaluationError(f"{path} is not a run folder with config.json, so a dataset is required")
    out = Path(out) if out else (path if kind == "run" else path.parent)
    _check_out(path, kind, out, other_data)

    batch_size = batch_size or PREDICT_BATCH
    splits = load_dataset(dataset, test_limit)
    images, labels = splits.test
    model = load_saved_model(path) if kind == "saved_model" else load_keras_model(
        path / "best.keras" if kind == "run" else path
    )
    _check_fits(model, splits, path)
    probabilities = predict_all(model, images, batch_size)
    attention, position = model.attention, model.position
    known = attention is not None and position is not None
    metrics = {
        "variant": config.variant if config else (f"{attention}-{position}" if known else None),
        "attention": attention,
        "position": position,
        "dataset": dataset,
        "seed": config.seed if config else None,
        **classification_metrics(labels, probabilities, model.params, splits.label_names),
        "params": model.params,
        "flops_per_image": model.flops(),
        **history_metrics(rows),
        **{
            f"latency_ms_batch{batch}": measure_latency(model.predict, model.image_shape, model.dtype, batch, repeats)
            for batch, repeats in LATENCY_REPEATS.items()
        },
        "device": device_name(model.backend),
        "backend": model.backend,
    }

    out.mkdir(parents=True, exist_ok=True)
    title = f"{metrics['variant'] or path.name} on {dataset}: accuracy {metrics['test_accuracy']:.4f}"
    plot_confusion_matrix(metrics["confusion_matrix"], splits.label_names, out / "confusion_matrix.png", title)
    if kind == "run" and (path / "export" / "saved_model.pb").is_file():
        check_export(path / "export", images, labels, probabilities, batch_size, out)
    if kind == "run" and (path / "logs").is_dir():
        log_test_metrics(path / "logs" / "test", metrics, step=len(rows))
    # Last: a run folder with metrics.json is finished, so everything else must be written by now.
    atomic.write_json(out / "metrics.json", metrics, sort_keys=False)
    return metrics


TENSORBOARD_TEST_METRICS = ("test_accuracy", "nll_per_image", "expected_calibration_error")


def log_test_metrics(log_dir, metrics, step):
    """The test metrics as TensorBoard scalars at the run's last epoch, beside its training curves.

    `tensorboard --logdir results/cpu` then shows them in the Scalars tab and
    as metric columns of the HParams table (which collects every scalar tag
    of a run's folders).
    """
    from experiments.event_logs import write_scalars

    write_scalars(log_dir, {key: metrics[key] for key in TENSORBOARD_TEST_METRICS}, step)


def check_export(export_path, images, labels, probabilities, batch_size, out):
    """Run the SavedModel on the test set, compare with the Keras probabilities.

    Writes export_agreement.json into `out` and raises EvaluationError when
    max |p_keras - p_savedmodel| exceeds `EXPORT_TOLERANCE`.

    Returns: the agreement dict.
    """
    exported = predict_all(load_saved_model(export_path), images, batch_size)
    if exported.shape != probabilities.shape:
        raise EvaluationError(f"{export_path} returns {exported.shape[1:]} outputs, the Keras model {probabilities.shape[1:]}")
    agreement = {
        "max_abs_difference": float(np.max(np.abs(exported - probabilities))),
        "keras_accuracy": float(np.mean(probabilities.argmax(axis=1) == labels)),
        "saved_model_accuracy": float(np.mean(exported.argmax(axis=1) == labels)),
        "tolerance": EXPORT_TOLERANCE,
    }
    atomic.write_json(out / "export_agreement.json", agreement, sort_keys=False)
    if agreement["max_abs_difference"] > EXPORT_TOLERANCE:
        raise EvaluationError(
            f"{export_path} disagrees with best.keras: max |p difference| "
            f"{agreement['max_abs_difference']:.3g} > {EXPORT_TOLERANCE}"
        )
    return agreement


def _check_out(path, kind, out, other_data):
    """EvaluationError where writing metrics.json into `out` would overwrite or invent a run's result.

    A run folder's metrics.json is its result, and the mark the queue and train.py take for "finished".
    """
    if not (out / "config.json").is_file():
        return
    give = "give --out DIR for the new result"
    if kind != "run" or out.resolve() != path.resolve():
        # A .keras file or a SavedModel inside a run folder (best.keras, export/) wrote there by default.
        raise EvaluationError(f"{out} is a run folder: evaluating {path} there would overwrite its metrics.json; {give}")
    if (path / "backup").is_dir():
        raise EvaluationError(f"{path} is still training (backup/ holds its state): its metrics.json would mark it "
                              f"finished; {give}, or finish it with its train.py command")
    if (path / "metrics.json").is_file() and other_data:
        raise EvaluationError(f"{path} is a finished run measured on its own test split; evaluating it on other data "
                              f"would overwrite its metrics.json: {give}")


def _path_kind(path):
    """"run", "keras" or "saved_model", or an EvaluationError saying what is wrong."""
    if not path.exists():
        raise EvaluationError(f"{path} does not exist")
    if (path / "config.json").is_file():
        if not (path / "best.keras").is_file():
            raise EvaluationError(f"Run folder {path} has no best.keras checkpoint")
        return "run"
    if (path / "saved_model.pb").is_file():
        return "saved_model"
    if path.is_file() and path.suffix == ".keras":
        return "keras"
    raise EvaluationError(
        f"{path} is not a run folder (config.json + best.keras), a .keras file or a SavedModel folder (saved_model.pb)"
    )


def _check_fits(model, splits, path):
    """Fail in one line when the data's image shape or class count differs from the model's."""
    if model.image_shape != splits.image_shape:
        raise EvaluationError(
            f"{path} takes images of shape {model.image_shape}, but {splits.name} has {splits.image_shape}"
        )
    if model.num_classes not in (None, splits.num_classes):
        raise EvaluationError(
            f"{path} predicts {model.num_classes} classes, but {splits.name} has {splits.num_classes}"
        )
