"""Test-set evaluation of a trained ViT: quality, information criteria and cost.

`evaluate` accepts what training leaves behind and writes one `metrics.json`
with exactly the keys of `METRIC_KEYS` (null where a value is unknown), plus a
confusion-matrix picture beside it:

* a run folder (``config.json``, ``best.keras``, ``history.csv`` and optionally
  an ``export/`` SavedModel, whose agreement with the Keras model is checked),
* a bare ``.keras`` file,
* a SavedModel folder (``saved_model.pb``) with a ``serve`` endpoint.

The metrics themselves (`classification_metrics`, `history_metrics`) are pure
numpy and csv, so they are tested by hand on tiny examples. TensorFlow is
allowed here: this is evaluation and export code, not a layer.
"""

import dataclasses
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np

from performer_keras import atomic
from performer_keras.checkpoints import read_history
from performer_keras.data import load_dataset
from performer_keras.flops import BACKENDS, count_flops, count_saved_model_flops
from performer_keras.kernel_attention import KernelAttention
from performer_keras.options import check_choice, check_positive

METRIC_KEYS = (
    "variant", "attention", "position", "dataset", "seed",
    "test_accuracy", "macro_precision", "macro_recall", "macro_f1",
    "per_class", "confusion_matrix", "test_examples", "log_likelihood", "nll_per_image",
    "expected_calibration_error", "aic", "bic",
    "params", "flops_per_image",
    "train_seconds_per_epoch", "epochs_to_90", "epochs_to_95", "epochs_to_99",
    "latency_ms_batch1", "latency_ms_batch256", "device", "backend",
)
# A class whose probability underflowed to 0 (float32 softmax) would make the
# log-likelihood -inf and AIC/BIC useless; one such confident mistake counts
# log(1e-12) ~ -27.6 instead.
PROBABILITY_FLOOR = 1e-12
# Probabilities are float32: Keras and its SavedModel may differ by rounding.
EXPORT_TOLERANCE = 1e-4
ACCURACY_THRESHOLDS = (0.90, 0.95, 0.99)
# Equal-width confidence bins of the expected calibration error (Guo et al. 2017, arXiv 1706.04599).
CALIBRATION_BINS = 15
# Keras logs float32 accuracies: 450/500 arrives as 0.8999999761581421.
_FLOAT32_SLACK = 1e-6
# Batch 1 is cheap and noisy, batch 256 is slow and steady.
LATENCY_REPEATS = {1: 30, 256: 5}
_WARMUP_CALLS = 2
_ANNOTATED_CLASSES = 20


class EvaluationError(ValueError):
    """Bad input to `evaluate` (a missing path, not a model, a mismatched dataset).

    The message is one line, so scripts print it instead of a traceback.
    """

    def __init__(self, message):
        super().__init__(" ".join(str(message).split()))


# === Metrics ===


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


def history_metrics(history_csv):
    """Training cost and speed of convergence from a Keras CSVLogger file.

    Returns a dict:
        train_seconds_per_epoch: median of the `epoch_seconds` column (the
            median, so the first epoch's tracing does not weigh in).
        epochs_to_90, epochs_to_95, epochs_to_99: the 1-based number of the
            first epoch whose val_accuracy reaches 0.90 / 0.95 / 0.99, None
            if none does. The number is the logged 0-based `epoch` plus one,
            so a resumed run that repeats an epoch still counts right.
    Every value is None when `history_csv` is None, missing or empty.
    """
    result = {"train_seconds_per_epoch": None}
    result.update({_threshold_key(t): None for t in ACCURACY_THRESHOLDS})
    if history_csv is None:
        return result
    rows = read_history(history_csv)
    seconds = [float(row["epoch_seconds"]) for row in rows if row.get("epoch_seconds")]
    if seconds:
        result["train_seconds_per_epoch"] = statistics.median(seconds)
    for threshold in ACCURACY_THRESHOLDS:
        result[_threshold_key(threshold)] = next(
            (
                int(row["epoch"]) + 1 if row.get("epoch") else index + 1
                for index, row in enumerate(rows)
                if row.get("val_accuracy") and float(row["val_accuracy"]) >= threshold - _FLOAT32_SLACK
            ),
            None,
        )
    return result


def _threshold_key(threshold):
    return f"epochs_to_{round(threshold * 100)}"


# === Cost ===


def measure_latency(predict_fn, image_shape, dtype, batch_size, repeats):
    """Milliseconds per image of `predict_fn` on one batch: median of warm runs.

    The first calls trace and compile, so `_WARMUP_CALLS` calls run untimed;
    each timed call converts the result to numpy, which waits for
    asynchronous backends (JAX, GPUs) to finish.

    Args:
        predict_fn: images (batch_size, *image_shape) of `dtype` -> outputs.
        image_shape: (H, W, C). dtype: input dtype ("float32", "uint8").
        batch_size, repeats: the batch and the number of timed calls.

    Returns: float, median seconds per call * 1000 / batch_size.
    """
    check_positive("batch_size", batch_size)
    check_positive("repeats", repeats)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(batch_size, *image_shape)).astype(dtype)
    for _ in range(_WARMUP_CALLS):
        np.asarray(predict_fn(images))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.asarray(predict_fn(images))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1000.0 / batch_size


def device_name(backend=None):
    """The device the backend computes on, e.g. "cpu: Intel(R) Xeon(R) (2 cores)".

    The first accelerator if there is one ("gpu: NVIDIA H100 80GB HBM3"),
    else the CPU model from /proc/cpuinfo and the cores this process may use.
    """
    backend = backend or keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform != "cpu":
            return f"{device.platform}: {device.device_kind}"
    elif backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            return f"gpu: {details.get('device_name', gpus[0].name)}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"cpu: {_cpu_model()} ({cores} cores)"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: fall through to what platform knows
    return platform.processor() or platform.machine()


# === Models ===


@dataclasses.dataclass
class LoadedModel:
    """What `evaluate` needs of a model, whether Keras or SavedModel.

    `predict` maps a batch (batch, H, W, C) of `dtype` pixels to class
    probabilities; `flops` counts one image's forward pass when called (None
    where the graph cannot be counted).
    attention and position come from the model's `KernelAttention` layers
    when it has them (None for a SavedModel).
    """

    predict: Callable
    dtype: str
    image_shape: tuple
    num_classes: int | None
    params: int | None
    flops: Callable[[], int | None]
    backend: str
    attention: str | None = None
    position: str | None = None


def load_keras_model(path):
    """A `.keras` file as a `LoadedModel`, predicting through a compiled call."""
    try:
        model = keras.models.load_model(path)
    except (ValueError, OSError) as err:
        raise EvaluationError(f"Could not load {path} as a Keras model: {_first_line(err)}") from None
    attention = next((layer for layer in model.layers if isinstance(layer, KernelAttention)), None)
    return LoadedModel(
        predict=compiled_predict(model),
        dtype=model.inputs[0].dtype,
        image_shape=tuple(model.inputs[0].shape[1:]),
        num_classes=model.outputs[0].shape[-1],
        params=sum(math.prod(weight.shape) for weight in model.trainable_weights),
        flops=lambda: count_flops(model, batch_size=1),
        backend=keras.backend.backend(),
        attention=None if attention is None else attention.kernel,
        position=None if attention is None else attention.position,
    )


def load_saved_model(path, endpoint="serve"):
    """A SavedModel folder as a `LoadedModel`, predicting through `endpoint`.

    Trainable parameters are those the export tracked (`keras.export`
    records them); None if the SavedModel does not list any.
    """
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))
    if not hasattr(loaded, endpoint):
        raise EvaluationError(f"SavedModel {path} has no {endpoint!r} endpoint")
    function = getattr(loaded, endpoint).concrete_functions[0]
    spec = function.structured_input_signature[0][0]
    variables = getattr(loaded, "trainable_variables", None)

    def predict(images):
        # Call through `loaded`: the endpoint alone does not keep the restored
        # variables alive, and TF fails once they are garbage-collected.
        return getattr(loaded, endpoint)(tf.convert_to_tensor(images))

    return LoadedModel(
        predict=predict,
        dtype=spec.dtype.name,
        image_shape=tuple(spec.shape[1:]),
        num_classes=_last_dim(function.structured_outputs),
        params=sum(math.prod(v.shape) for v in variables) if variables else None,
        flops=lambda: count_saved_model_flops(path, tuple(spec.shape[1:]), endpoint=endpoint),
        backend="tensorflow",
    )


def compiled_predict(model):
    """model(images, training=False) compiled once: a tf.function or a jax.jit."""
    backend = check_choice("backend", keras.backend.backend(), BACKENDS)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(lambda images: model(images, training=False), autograph=False)
    import jax

    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    @jax.jit
    def forward(trainable, non_trainable, images):
        return model.stateless_call(trainable, non_trainable, images, training=False)[0]

    return lambda images: forward(trainable, non_trainable, images)


def predict_all(model, images, batch_size):
    """float32 probabilities (n, classes) of `model` on uint8 `images`, in batches.

    Pixels are cast to the model's input dtype unchanged (float32 in [0, 255]
    for the Keras model, as `data.eval_pipeline` yields them).
    """
    return np.concatenate([
        np.asarray(model.predict(images[start:start + batch_size].astype(model.dtype)), np.float32)
        for start in range(0, len(images), batch_size)
    ])


# === Evaluation ===


def evaluate(path, dataset=None, limit=None, batch_size=256, out=None):
    """Evaluate a run folder, a `.keras` file or a SavedModel on a test split.

    Args:
        path: a run folder (has config.json and best.keras), a `.keras` file or
            a SavedModel folder (has saved_model.pb).
        dataset, limit: the test data (`data.load_dataset`); default from the
            run's config.json, required for a bare model.
        batch_size: batch of the test predictions.
        out: folder for metrics.json and confusion_matrix.png; default the run
            folder, else the folder holding the model.

    A run folder with an `export/` SavedModel also runs the export on the
    test set and writes export_agreement.json (max |p_keras - p_savedmodel|,
    both accuracies) beside metrics.json; an EvaluationError follows if the
    probabilities differ by more than `EXPORT_TOLERANCE`.

    Returns: the metrics dict, keys exactly `METRIC_KEYS`.

    Raises:
        EvaluationError: bad path, no dataset, or data that does not fit the
            model. data.DataError: the dataset cannot be loaded.
    """
    path = Path(path)
    kind = _path_kind(path)
    try:
        config = json.loads((path / "config.json").read_text()) if kind == "run" else {}
    except ValueError as error:
        raise EvaluationError(f"{path / 'config.json'} is not valid JSON ({error})") from None
    if kind == "run" and out is None and (path / "metrics.json").is_file() and (
        (dataset or config.get("dataset")) != config.get("dataset") or (limit is not None and limit != config.get("limit"))
    ):
        raise EvaluationError(f"{path} is a finished run measured on its own test split; evaluating it on other data "
                              f"would overwrite its metrics.json: give --out DIR for the new result")
    dataset = dataset or config.get("dataset")
    if dataset is None:
        raise EvaluationError(f"{path} is not a run folder with config.json, so a dataset is required")
    if limit is None:
        limit = config.get("limit")
        limit_test = config.get("limit_test", True)
    else:
        limit_test = True
    out = Path(out) if out else (path if kind == "run" else path.parent)

    splits = load_dataset(dataset, limit, limit_test=limit_test)
    images, labels = splits.test
    model = load_saved_model(path) if kind == "saved_model" else load_keras_model(
        path / "best.keras" if kind == "run" else path
    )
    _check_fits(model, splits, path)
    probabilities = predict_all(model, images, batch_size)
    attention = config.get("attention", model.attention)
    position = config.get("position", model.position)
    known = attention is not None and position is not None
    metrics = {
        "variant": config.get("variant", f"{attention}-{position}" if known else None),
        "attention": attention,
        "position": position,
        "dataset": dataset,
        "seed": config.get("seed"),
        **classification_metrics(labels, probabilities, model.params, splits.label_names),
        "params": model.params,
        "flops_per_image": model.flops(),
        **history_metrics(path / "history.csv" if kind == "run" else None),
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
        log_test_metrics(path / "logs" / "test", metrics, step=len(read_history(path / "history.csv")))
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
    import tensorflow as tf

    with tf.summary.create_file_writer(str(log_dir)).as_default():
        for key in TENSORBOARD_TEST_METRICS:
            tf.summary.scalar(key, metrics[key], step=step)


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


def plot_confusion_matrix(confusion, class_names, path, title=""):
    """Save the confusion matrix as a PNG: rows true, columns predicted.

    Colour is the fraction of each true class (so rare and common classes
    read alike), annotated with counts up to `_ANNOTATED_CLASSES` classes.
    Uses matplotlib's object API with the Agg canvas, never pyplot, so the
    caller's matplotlib backend is left alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(confusion)
    rates = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    num_classes = len(counts)
    size = max(4.0, 0.45 * num_classes + 2.0)
    figure = Figure(figsize=(size + 1.0, size))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(rates, cmap="Blues", vmin=0.0, vmax=1.0)
    axes.set(
        xticks=range(num_classes), yticks=range(num_classes),
        xticklabels=class_names, yticklabels=class_names,
        xlabel="predicted class", ylabel="true class", title=title,
    )
    axes.tick_params(axis="x", labelrotation=90 if num_classes > 10 else 0)
    if num_classes <= _ANNOTATED_CLASSES:
        for (row, column), count in np.ndenumerate(counts):
            colour = "white" if rates[row, column] > 0.5 else "black"
            axes.text(column, row, str(count), ha="center", va="center", color=colour, fontsize=8)
    figure.colorbar(image, ax=axes, label="fraction of the true class")
    figure.tight_layout()
    atomic.save_figure(figure, path, dpi=100)


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


def _last_dim(outputs):
    """Classes of a single-tensor output spec; None for dict outputs or unknown width."""
    shape = getattr(outputs, "shape", None)
    return None if shape is None or not shape.rank else shape[-1]


def _first_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
