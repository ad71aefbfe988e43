"""Tests of experiments.evaluation, experiments.flops and evaluate.py.

Metrics are checked against numbers worked out by hand; FLOPs from the graph
against the analytic count; evaluate() end to end on a fabricated run folder.
"""

import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import performer_keras
from experiments.evaluation import evaluate
from experiments.export import EXPORT_RECORD, export_saved_model, write_export_record
from experiments.metrics import classification_metrics, format_table, history_metrics
from experiments.history import read_history
from experiments.models import EvaluationError
from experiments.run_config import RunConfig
from experiments.flops import analytic_attention_flops, count_flops, count_training_flops
from run_folders import tiny_run_folder

REPO = Path(__file__).resolve().parent.parent
# The contract of metrics.json, written out here rather than imported, so the
# test fails if the implementation drifts from it.
CONTRACT_KEYS = {
    "variant", "attention", "position", "dataset", "seed", "test_accuracy", "macro_precision",
    "macro_recall", "macro_f1", "per_class", "confusion_matrix", "test_examples", "log_likelihood",
    "nll_per_image", "expected_calibration_error", "aic", "bic",
    "params", "flops_per_image", "train_seconds_per_epoch", "epochs_to_90", "epochs_to_95",
    "epochs_to_99", "latency_ms_batch1", "latency_ms_batch256", "device", "backend",
}
FRACTIONS = ("test_accuracy", "macro_precision", "macro_recall", "macro_f1")


# === classification_metrics ===

# Three classes, six examples. Predictions (argmax) are 0, 1, 1, 0, 1, 1, so
# class 2 is never predicted, and the last example gives its true class
# probability exactly 0 (clipped to 1e-12).
LABELS = [0, 0, 1, 1, 2, 2]
PROBABILITIES = [
    [0.7, 0.2, 0.1],
    [0.2, 0.5, 0.3],
    [0.1, 0.8, 0.1],
    [0.6, 0.3, 0.1],
    [0.2, 0.5, 0.3],
    [0.0, 1.0, 0.0],
]


def test_classification_metrics_by_hand():
    metrics = classification_metrics(LABELS, PROBABILITIES, num_params=10, label_names=("a", "b", "c"))
    # Rows are true classes: 0 -> {0, 1}, 1 -> {1, 0}, 2 -> {1, 1}.
    assert metrics["confusion_matrix"] == [[1, 1, 0], [1, 1, 0], [0, 2, 0]]
    assert metrics["test_accuracy"] == pytest.approx(2 / 6)
    # precision: column 0 holds 1 of 2 right, column 1 1 of 4, column 2 is
    # empty (never predicted) and counts 0.
    # recall: 1/2, 1/2, 0/2.  F1 = 2PR/(P+R): 1/2, 2(1/4)(1/2)/(3/4) = 1/3, 0.
    expected = [("a", 0.5, 0.5, 0.5), ("b", 0.25, 0.5, 1 / 3), ("c", 0.0, 0.0, 0.0)]
    for row, (name, precision, recall, f1) in zip(metrics["per_class"], expected):
        assert row["class"] == name
        assert row["precision"] == pytest.approx(precision)
        assert row["recall"] == pytest.approx(recall)
        assert row["f1"] == pytest.approx(f1)
        assert row["support"] == 2
    assert metrics["macro_precision"] == pytest.approx(0.25)  # (1/2 + 1/4 + 0) / 3
    assert metrics["macro_recall"] == pytest.approx(1 / 3)  # (1/2 + 1/2 + 0) / 3
    assert metrics["macro_f1"] == pytest.approx(5 / 18)  # (1/2 + 1/3 + 0) / 3
    # logL = ln .7 + ln .2 + ln .8 + ln .3 + ln .3 + ln 1e-12
    #      = -0.35667 - 1.60944 - 0.22314 - 1.20397 - 1.20397 - 27.63102
    assert metrics["log_likelihood"] == pytest.approx(-32.228223, abs=1e-5)
    assert metrics["aic"] == pytest.approx(84.456446, abs=1e-5)  # 2*10 + 64.456446
    assert metrics["bic"] == pytest.approx(82.374041, abs=1e-5)  # 10 ln 6 + 64.456446
    assert metrics["test_examples"] == 6
    assert metrics["nll_per_image"] == pytest.approx(32.228223 / 6, abs=1e-6)
    # Confidences 0.7 (right), 0.5 (wrong), 0.8 (right), 0.6 (wrong), 0.5 (wrong),
    # 1.0 (wrong), each level in a bin of its own (bins are 1/15 wide):
    # ECE = (2 |0 - 0.5| + |0 - 0.6| + |1 - 0.7| + |1 - 0.8| + |0 - 1.0|) / 6 = 3.1 / 6.
    assert metrics["expected_calibration_error"] == pytest.approx(3.1 / 6)


def test_classification_metrics_names_default_to_indices_and_no_params_no_criteria():
    metrics = classification_metrics(np.array(LABELS), np.array(PROBABILITIES, np.float32), num_params=None)
    assert [row["class"] for row in metrics["per_class"]] == [0, 1, 2]
    assert metrics["aic"] is None and metrics["bic"] is None
    json.dumps(metrics)  # plain Python numbers only


def test_calibration_error_is_zero_when_confidence_matches_accuracy():
    # Confidence 0.75 on every example, 3 of 4 right: perfectly calibrated.
    probabilities = [[0.75, 0.25]] * 4
    metrics = classification_metrics([0, 0, 0, 1], probabilities, num_params=None)
    assert metrics["expected_calibration_error"] == pytest.approx(0.0, abs=1e-12)


def test_classification_metrics_rejects_out_of_range_labels():
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        classification_metrics([0, 3], [[1.0, 0.0, 0.0]] * 2, num_params=1)


# === history_metrics ===


def test_history_metrics_by_hand(tmp_path):
    history = tmp_path / "history.csv"
    # Epoch 1 logs 0.9 as float32 (450/500), which must count as reaching 0.90.
    history.write_text(
        "epoch,accuracy,loss,val_accuracy,val_loss,epoch_seconds\n"
        "0,0.50,1.5,0.80,0.9,12.0\n"
        "1,0.85,0.6,0.8999999761581421,0.4,5.0\n"
        "2,0.93,0.3,0.955,0.2,6.0\n"
        "3,0.96,0.2,0.94,0.2,5.5\n"
    )
    assert history_metrics(read_history(history)) == {
        "train_seconds_per_epoch": 5.75,  # median of 12, 5, 6, 5.5
        "epochs_to_90": 2,
        "epochs_to_95": 3,
        "epochs_to_99": None,
    }
    nothing = dict.fromkeys(("train_seconds_per_epoch", "epochs_to_90", "epochs_to_95", "epochs_to_99"))
    assert history_metrics(read_history(tmp_path / "missing.csv")) == nothing


# === FLOPs ===


def attention_model(kernel, tokens, width, heads, num_features=16):
    """A model holding one KernelAttention over `tokens` tokens (no grid)."""
    inputs = keras.Input((tokens, width))
    outputs = performer_keras.KernelAttention(
        heads, kernel, "absolute", grid_size=None, num_features=num_features, linformer_dim=num_features
    )(inputs)
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("kernel", ["softmax", "favor", "relu", "exp", "linformer"])
@pytest.mark.parametrize("tokens", [16, 64, 256])
def test_graph_flops_match_analytic_count(kernel, tokens):
    counted = count_flops(attention_model(kernel, tokens, width=32, heads=4))
    analytic = analytic_attention_flops(tokens, 32, 4, kernel, num_features=16)
    # The graph also counts biases, scaling and softmax/feature elementwise
    # work, which the analytic matmul count leaves out: never less, <20% more.
    assert analytic <= counted <= 1.2 * analytic


@pytest.mark.parametrize("kernel, growth", [("softmax", 4.0), ("favor", 2.0)])
def test_flops_grow_quadratically_for_softmax_linearly_for_favor(kernel, growth):
    # Width 16 keeps the N^2 term dominant over the 8 N D^2 projections.
    small, large = (count_flops(attention_model(kernel, n, width=16, heads=2)) for n in (512, 1024))
    assert large / small == pytest.approx(growth, rel=0.06)


def test_training_flops_are_about_three_forward_passes():
    model = performer_keras.create_model("favor-absolute", size="tiny")
    forward = count_flops(model)
    # Backward costs about twice the forward pass (two matmuls per matmul).
    assert 2.5 * forward < count_training_flops(model) < 3.5 * forward
    assert count_flops(model, batch_size=2, training=True) == pytest.approx(2 * count_training_flops(model), rel=0.05)


def test_jax_flops_match_analytic_count():
    """The JAX path (XLA cost analysis) runs in a subprocess: the backend is fixed at import."""
    script = (
        "import keras, performer_keras\n"
        "from experiments.flops import count_flops\n"
        "for kernel in ('softmax', 'favor'):\n"
        "    inputs = keras.Input((64, 32))\n"
        "    layer = performer_keras.KernelAttention(4, kernel, grid_size=None, num_features=16)\n"
        "    print(count_flops(keras.Model(inputs, layer(inputs))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "KERAS_BACKEND": "jax"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    counted = [int(line) for line in result.stdout.split()]
    for kernel, flops in zip(("softmax", "favor"), counted):
        analytic = analytic_attention_flops(64, 32, 4, kernel, num_features=16)
        assert analytic <= flops <= 1.2 * analytic


def test_counting_flops_logs_no_deprecation_warning_of_tensorflow(caplog):
    """The profiler's TF1 internals logged "tensor_shape_from_node_def_name ... is deprecated" in
    every train.py and evaluate.py run on TensorFlow. TensorFlow logs such a warning once a process,
    so the record of it is cleared first: another test may have counted FLOPs in this worker."""
    from tensorflow.python.util import deprecation

    deprecation._PRINTED_WARNING.clear()
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        count_flops(attention_model("softmax", 16, width=32, heads=4))
    assert not [record.getMessage() for record in caplog.records if "deprecated" in record.getMessage()]


# === evaluate() end to end ===


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A run folder as training writes it: config, checkpoint, history, export."""
    run = tmp_path_factory.mktemp("run")
    config = RunConfig(variant="softmax-absolute", dataset="mnist", size="tiny", seed=7, limit=200, epochs=2,
                       batch_size=32).to_dict()
    model = tiny_run_folder(run, "softmax-absolute", config, "epoch,accuracy,loss,val_accuracy,val_loss,epoch_seconds\n"
                                                             "0,0.40,2.0,0.91,1.0,3.0\n"
                                                             "1,0.90,0.5,0.96,0.3,1.0\n")
    export_saved_model(model, run / "export")
    return run, model


def test_evaluate_run_folder(run_folder):
    run, model = run_folder
    metrics = evaluate(run, batch_size=64)

    written = json.loads((run / "metrics.json").read_text())
    assert set(written) == CONTRACT_KEYS and written == metrics
    assert (run / "confusion_matrix.png").stat().st_size > 0
    assert (metrics["variant"], metrics["dataset"], metrics["seed"]) == ("softmax-absolute", "mnist", 7)
    for key in FRACTIONS:
        assert 0.0 <= metrics[key] <= 1.0
    for row in metrics["per_class"]:
        assert all(0.0 <= row[key] <= 1.0 for key in ("precision", "recall", "f1"))
    confusion = np.array(metrics["confusion_matrix"])
    assert confusion.shape == (10, 10) and confusion.sum() == 200  # limit 200 test examples
    assert metrics["test_accuracy"] == pytest.approx(np.trace(confusion) / 200)
    assert metrics["params"] == sum(math.prod(w.shape) for w in model.trainable_weights)
    assert metrics["flops_per_image"] == count_flops(model)
    assert metrics["log_likelihood"] < 0 and math.isfinite(metrics["aic"]) and math.isfinite(metrics["bic"])
    assert (metrics["train_seconds_per_epoch"], metrics["epochs_to_90"], metrics["epochs_to_95"]) == (2.0, 1, 2)
    assert metrics["epochs_to_99"] is None
    assert metrics["latency_ms_batch1"] > 0 and metrics["latency_ms_batch256"] > 0
    assert metrics["backend"] == keras.backend.backend() and metrics["device"].startswith(("cpu:", "gpu:"))

    agreement = json.loads((run / "export_agreement.json").read_text())
    assert agreement["max_abs_difference"] <= 1e-4
    assert agreement["saved_model_accuracy"] == agreement["keras_accuracy"] == metrics["test_accuracy"]
    assert "test_accuracy" in format_table(metrics)


def test_an_export_of_train_py_is_evaluated_on_its_runs_data(run_folder, tmp_path):
    # train.py's export records its run's settings: moved away from the run folder, it still knows its test
    # data and variant (a bare SavedModel needed --dataset and reported no variant).
    run, _ = run_folder
    export = shutil.copytree(run / "export", tmp_path / "export")
    write_export_record(export, run, RunConfig.from_recorded(json.loads((run / "config.json").read_text())))
    metrics = evaluate(export)
    assert (metrics["variant"], metrics["dataset"], metrics["seed"]) == ("softmax-absolute", "mnist", 7)
    assert np.array(metrics["confusion_matrix"]).sum() == 200  # the run's limit of 200 test examples
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    # A record damaged by hand is named, in one line.
    record = json.loads((export / EXPORT_RECORD).read_text())
    (export / EXPORT_RECORD).write_text(json.dumps({**record, "config": {**record["config"], "limit": "x"}}))
    with pytest.raises(EvaluationError, match=r"export_of.json's config describes no run \(limit must be"):
        evaluate(export)


def test_evaluate_bare_saved_model_needs_a_dataset(run_folder, tmp_path):
    run, model = run_folder
    with pytest.raises(EvaluationError, match="dataset is required"):
        evaluate(run / "export")
    with pytest.raises(EvaluationError, match="is a run folder: evaluating .* would overwrite its metrics.json"):
        evaluate(run / "export", dataset="mnist", limit=50)  # by default beside the SavedModel: in the run folder
    metrics = evaluate(run / "export", dataset="mnist", limit=50, out=tmp_path)
    assert set(json.loads((tmp_path / "metrics.json").read_text())) == CONTRACT_KEYS
    # A bare SavedModel knows neither its variant nor its training history.
    assert metrics["variant"] is None and metrics["seed"] is None and metrics["epochs_to_90"] is None
    # The export tracks the same trainable weights and computes the same graph,
    # which is opaque StableHLO to the TF profiler when exported from JAX.
    assert metrics["params"] == sum(math.prod(w.shape) for w in model.trainable_weights)
    assert metrics["flops_per_image"] == (count_flops(model) if keras.backend.backend() == "tensorflow" else None)
    assert (tmp_path / "confusion_matrix.png").is_file()


def test_evaluate_script_fails_in_one_line_on_a_missing_path(tmp_path):
    result = subprocess.run(
        [sys.executable, "evaluate.py", str(tmp_path / "missing")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("evaluate.py: error:") and "does not exist" in message


@pytest.mark.filterwarnings("error::UserWarning")
def test_saliency_uses_tf_keras_vis_without_a_warning_from_keras():
    # tf-keras-vis calls the model with a list of its one input, and Keras warned in every report with checkpoints;
    # with the warning an error, SmoothGrad failed and the report silently fell back to the plain gradient.
    from experiments.saliency import saliency_maps

    images = np.random.default_rng(0).integers(0, 256, (2, 28, 28, 1)).astype("uint8")
    maps, method = saliency_maps(performer_keras.create_model("softmax-absolute", size="tiny"), images, np.array([1, 2]))
    assert method.startswith("tf-keras-vis SmoothGrad") and maps.shape == (2, 28, 28)
    assert 0.0 <= maps.min() and maps.max() <= 1.0 + 1e-6
