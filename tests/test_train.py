"""train.py and evaluate.py end to end on subsampled real MNIST with tiny models.

Most runs call `train.main` in the test process, which behaves as the command
line does (exit codes, one-line errors) without a new TensorFlow start-up; the
kill -9 test and evaluate.py run as real subprocesses.
"""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import train

REPO = Path(__file__).resolve().parent.parent
# Without XLA, train.py's default on TensorFlow: its compilation is most of a one-epoch tiny run. The tests
# that train through XLA ask for it (--jit-compile, or the default in the kill-and-resume test).
TINY = ["--size", "tiny", "--limit", "400", "--batch-size", "32", "--no-jit-compile"]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))


def train_ok(*args):
    code = train.main([str(a) for a in args])
    assert code == 0, f"train.py exited {code}"


def train_fails(capsys, *args):
    """Exit code and the last line on stderr of a run expected to fail."""
    capsys.readouterr()
    try:
        code = train.main([str(a) for a in args])
    except SystemExit as exit:  # an argparse error: one line, then exit
        code = exit.code
    err = capsys.readouterr().err
    return code, [line for line in err.strip().splitlines() if line.strip()][-1]


def run_script(*args, script="train.py"):
    result = subprocess.run(
        [sys.executable, str(REPO / script), *map(str, args)],
        capture_output=True, text=True, env=ENV, cwd=REPO,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def metrics(folder):
    return json.loads((Path(folder) / "metrics.json").read_text())


@pytest.fixture(scope="module")
def softmax_run(tmp_path_factory):
    """One finished tiny softmax run, shared by the tests that read or reuse it."""
    out = tmp_path_factory.mktemp("softmax") / "run"
    train_ok(*TINY, "--epochs", "1", "--out", out)
    return out


def test_run_folder_and_evaluate_py(softmax_run):
    for name in ("config.json", "history.csv", "best.keras", "metrics.json", "throughput.json", "confusion_matrix.png"):
        assert (softmax_run / name).exists(), name
    assert not (softmax_run / "backup").exists()  # a finished run leaves no backup behind
    trained = metrics(softmax_run)
    assert trained["variant"] == "softmax-absolute" and trained["dataset"] == "mnist"
    throughput = json.loads((softmax_run / "throughput.json").read_text())
    assert throughput["pipeline_images_per_second"] > 0 and throughput["training_images_per_second"] > 0
    # evaluate.py, a separate process, reproduces every figure that does not depend on timing.
    out = softmax_run.parent / "evaluated"
    run_script(softmax_run / "best.keras", "--dataset", "mnist", "--limit", "400", "--out", out, script="evaluate.py")
    again = metrics(out)
    assert again["confusion_matrix"] == trained["confusion_matrix"]
    for key in ("test_accuracy", "log_likelihood", "aic", "bic", "params", "flops_per_image"):
        assert again[key] == pytest.approx(trained[key], rel=1e-6), key


def test_a_damaged_metrics_json_is_measured_again_without_training(softmax_run, tmp_path):
    # metrics.json is a run's last, atomic write, so damage came later (an edit, a disk); train.py read it back
    # and stopped with a JSONDecodeError traceback.
    run = tmp_path / "run"
    shutil.copytree(softmax_run, run)
    before = {name: (run / name).read_bytes() for name in ("history.csv", "provenance.json", "best.keras")}
    (run / "metrics.json").write_text("{")
    result = run_script(*TINY, "--epochs", "1", "--out", run)
    assert f"{run / 'metrics.json'} cannot be read: measuring the run again" in result.stdout
    assert metrics(run)["test_accuracy"] == metrics(softmax_run)["test_accuracy"]
    assert {name: (run / name).read_bytes() for name in before} == before  # no epoch trained, no session added


def test_hparams_and_scalars_logged_for_tensorboard(softmax_run):
    import tensorflow as tf

    plugins = {
        value.metadata.plugin_data.plugin_name
        for events in (softmax_run / "logs").rglob("events.out.tfevents*")
        for event in tf.compat.v1.train.summary_iterator(str(events))
        for value in event.summary.value
    }
    assert {"hparams", "scalars"} <= plugins
    # The effective size, never the string "None"; the experiment declares its metric columns.
    from tensorboard.plugins.hparams import plugin_data_pb2

    hparams, columns = {}, set()
    for events in (softmax_run / "logs").glob("events.out.tfevents*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != "hparams":
                    continue
                data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                if data.HasField("session_start_info"):
                    hparams = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                               for k, v in data.session_start_info.hparams.items()}
                if data.HasField("experiment"):
                    columns = {(m.name.tag, m.name.group) for m in data.experiment.metric_infos}
    assert hparams["width"] == 16 and hparams["depth"] == 1 and "None" not in hparams.values()
    assert {("epoch_accuracy", "validation"), ("test_accuracy", "test")} <= columns
    logged = {
        value.tag: float(tf.make_ndarray(value.tensor))
        for events in (softmax_run / "logs" / "test").glob("events.out.tfevents*")
        for event in tf.compat.v1.train.summary_iterator(str(events))
        for value in event.summary.value
    }
    expected = metrics(softmax_run)
    for key in ("test_accuracy", "nll_per_image", "expected_calibration_error"):
        assert logged[key] == pytest.approx(expected[key], rel=1e-6), key
    with open(softmax_run / "history.csv") as f:
        row = next(csv.DictReader(f))
    assert float(row["learning_rate"]) >= 0 and float(row["epoch_seconds"]) > 0


@pytest.mark.parametrize("variant", ["favor-rope", "relu-string", "favor-kerple"])
def test_each_linear_kernel_family_trains_and_evaluates(tmp_path, variant):
    out = tmp_path / "run"
    # Through XLA, as train.py and the `cpu` profile train (the last --[no-]jit-compile wins).
    train_ok("--variant", variant, *TINY, "--jit-compile", "--epochs", "1", "--out", out)
    trained = metrics(out)
    assert (trained["attention"], trained["position"]) == tuple(variant.split("-"))
    assert 0.0 <= trained["test_accuracy"] <= 1.0 and trained["flops_per_image"] > 0


def test_a_mixed_float16_run_reloads_its_best_model_without_warnings(tmp_path):
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_ok(*TINY, "--epochs", "1", "--precision", "mixed_float16", "--out", out)
    # Loading best.keras with its optimizer (evaluation, export, --init-from) skipped the
    # loss-scale optimizer's variables with a UserWarning, alarming in a run's log for nothing.
    assert not [str(w.message) for w in caught if "Skipping variable loading" in str(w.message)]
    assert metrics(out)["test_examples"] > 0


@pytest.mark.slow  # a SavedModel export and reload, half a minute; test_positions.py reloads one in a fresh process in the quick loop
def test_export_serves_uint8_with_the_same_predictions(tmp_path):
    import keras
    import tensorflow as tf

    from experiments.data import load_dataset

    out, export = tmp_path / "run", tmp_path / "export"
    train_ok("--variant", "relu-rope", *TINY, "--epochs", "1", "--out", out, "--export", export)
    images = load_dataset("mnist", limit=64).test[0]
    loaded = tf.saved_model.load(str(export))
    served = loaded.serve(tf.constant(images, tf.uint8)).numpy()
    model = keras.models.load_model(out / "best.keras")
    np.testing.assert_allclose(served, model.predict(images.astype("float32"), verbose=0), atol=1e-5)
    np.testing.assert_allclose(served.sum(axis=1), 1.0, atol=1e-5)
    # The finished run exports again over its own export (its command again); another run may not write there.
    recorded = json.loads((export / "export_of.json").read_text())
    assert recorded == {"run": str(out.resolve()), "config": json.loads((out / "config.json").read_text())}
    (export / "saved_model.pb").unlink()
    train_ok("--variant", "relu-rope", *TINY, "--epochs", "1", "--out", out, "--export", export)
    assert (export / "saved_model.pb").is_file()
    assert train.main(["--variant", "relu-rope", *TINY, "--epochs", "1", "--out", str(tmp_path / "other"),
                       "--export", str(export)]) == 2


@pytest.mark.slow  # a real train.py killed after an epoch, over a minute; tests/test_kill.py kills at every write
def test_same_seed_same_metrics_and_resume_after_kill(tmp_path):
    # With dropout, whose masks must go on where the killed run stopped (StepDropout), and label smoothing.
    args = ["--variant", "favor-absolute", "--size", "tiny", "--limit", "2000", "--batch-size", "16",
            "--epochs", "3", "--redraw-interval", "7", "--dropout", "0.1", "--label-smoothing", "0.1"]
    reference = tmp_path / "uninterrupted"
    train_ok(*args, "--out", reference)

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args, "--out", str(killed)],
        env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    metadata = killed / "backup" / "state.json"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if metadata.exists() and json.loads(metadata.read_text())["states"][0]["epoch"] >= 1:
            break  # the file is renamed into place whole, never read half-written
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "metrics.json").exists(), "the run finished before it could be killed"
    assert metadata.exists()

    run_script(*args, "--out", killed)  # the same command resumes
    with open(killed / "history.csv") as f:
        epochs = [int(row["epoch"]) for row in csv.DictReader(f)]
    assert epochs == [0, 1, 2]
    # The killed process was a second run of the same seed: its epochs and the resumed ones give the same metrics.
    resumed, uninterrupted = metrics(killed), metrics(reference)
    assert resumed["confusion_matrix"] == uninterrupted["confusion_matrix"]
    for key in ("test_accuracy", "log_likelihood"):
        assert resumed[key] == pytest.approx(uninterrupted[key], rel=1e-5), key


def test_a_trained_run_whose_best_keras_was_damaged_is_refused_in_one_line(softmax_run, tmp_path, capsys):
    # Killed during evaluation (training done), then best.keras emptied: a traceback (an EvaluationError) before,
    # and Keras' own words for a file that exists, "File not found".
    run = tmp_path / "run"
    shutil.copytree(softmax_run, run)
    (run / "metrics.json").unlink()
    (run / "best.keras").write_bytes(b"")
    damaged = f"{run / 'best.keras'} is no .keras file (not a zip archive: damaged, or another format)"
    assert train_fails(capsys, *TINY, "--epochs", "1", "--out", run) == (
        2, f"train.py: error: Could not load {run / 'best.keras'} as a Keras model: {damaged}")
    assert train_fails(capsys, *TINY, "--epochs", "1", "--out", run, "--export", tmp_path / "export") == (
        2, f"train.py: error: cannot export {run / 'best.keras'}: {damaged}")
    assert not (tmp_path / "export").exists() and not (run / "metrics.json").exists()


def test_finished_run_is_not_trained_again(softmax_run):
    before = (softmax_run / "metrics.json").stat().st_mtime_ns
    train_ok(*TINY, "--epochs", "1", "--out", softmax_run)
    assert (softmax_run / "metrics.json").stat().st_mtime_ns == before
    # Killed during evaluation (training done, no metrics yet): only evaluation runs again.
    checkpoint = (softmax_run / "best.keras").stat().st_mtime_ns
    (softmax_run / "metrics.json").unlink()
    train_ok(*TINY, "--epochs", "1", "--out", softmax_run)
    assert (softmax_run / "metrics.json").exists()
    assert (softmax_run / "best.keras").stat().st_mtime_ns == checkpoint


def test_kept_epochs_are_the_backups_of_their_epochs_and_survive_rotation(tmp_path):
    import keras

    from experiments.checkpoints import KEPT_STATES, KillSafeBackup

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    backup = KillSafeBackup(tmp_path / "run" / "backup", keep_epochs=[1, 3])
    backup.set_model(model)
    written = {}
    for epoch in range(4):
        model.layers[0].kernel.assign(np.full((3, 2), float(epoch), "float32"))
        backup.on_epoch_end(epoch)
        written[epoch + 1] = (tmp_path / "run" / "backup" / f"epoch{epoch + 1:04d}.weights.h5").read_bytes()
    assert len(list((tmp_path / "run" / "backup").glob("*.h5"))) == KEPT_STATES  # epochs 3 and 4
    backup.on_train_end()
    assert not (tmp_path / "run" / "backup").exists()
    kept = tmp_path / "run" / "epochs"
    assert sorted(path.name for path in kept.iterdir()) == ["epoch0001.weights.h5", "epoch0003.weights.h5"]
    assert [(kept / f"epoch{k:04d}.weights.h5").read_bytes() for k in (1, 3)] == [written[1], written[3]]
    model.load_weights(kept / "epoch0001.weights.h5")
    np.testing.assert_array_equal(model.layers[0].kernel, np.zeros((3, 2)))


def test_keep_epochs_keeps_them_for_favor_floor_and_says_which_it_cannot(tmp_path, capsys):
    from experiments import favor_floor
    from experiments.checkpoints import missed_epochs

    args = [*TINY, "--variant", "favor-absolute", "--epochs", "3", "--out", tmp_path / "run"]
    train_ok(*args, "--keep-epochs", "1", "3")
    kept = tmp_path / "run" / "epochs"
    assert sorted(path.name for path in kept.iterdir()) == ["epoch0001.weights.h5", "epoch0003.weights.h5"]
    assert not (tmp_path / "run" / "backup").exists()

    assert favor_floor.main([str(kept / "epoch0001.weights.h5"), str(kept / "epoch0003.weights.h5"), "--limit", "8"]) == 0
    first, last = json.loads((tmp_path / "run" / "favor_floor.json").read_text())["checkpoints"]
    with open(tmp_path / "run" / "history.csv") as f:
        validation = [float(row["val_accuracy"]) for row in csv.DictReader(f)]
    assert (first["epoch"], first["val_accuracy"], last["epoch"], last["val_accuracy"]) == (1, validation[0], 3,
                                                                                              validation[2])
    assert first["layers"] != last["layers"]  # two epochs' weights, not one file twice

    # Asked again of the finished run: epoch 2 was never kept, and it says so in one line.
    capsys.readouterr()
    train_ok(*args, "--keep-epochs", "2", "3")
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "--keep-epochs" in line] == [
        f"--keep-epochs: epoch 2 of {tmp_path / 'run'} was trained before it was asked for and cannot be kept now"]
    # A run resuming after epoch 2 has trained epochs 1 and 2; what it kept is not missed.
    assert missed_epochs([1, 2, 3], 2, kept) == [2]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variant", "favor-nope"], "Unknown position 'nope'"),
        (["--variant", "magic-rope"], "Unknown attention 'magic'"),
        (["--dataset", "no_such_dataset_xyz"], "mnist"),
        (["--batch-size", "0"], "--batch-size"),
        (["--num-features", "0"], "--num-features"),
        (["--hparams", "/no/such/file.json"], "cannot read --hparams"),
        (["--init-from", "/no/such/model.keras"], "cannot read --init-from"),
        (["--precision", "float8"], "Unknown precision"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, message):
    code, last_line = train_fails(capsys, *TINY, "--epochs", "1", *args, "--out", tmp_path / "run")
    assert code == 2
    assert message in last_line


def test_other_run_in_out_folder_is_refused_and_untouched(softmax_run, capsys):
    config_before = (softmax_run / "config.json").read_text()
    metrics_before = (softmax_run / "metrics.json").read_text()
    code, last_line = train_fails(capsys, *TINY, "--epochs", "1", "--learning-rate", "0.01", "--out", softmax_run)
    assert code == 2
    assert "holds a different run" in last_line and "learning_rate" in last_line
    assert (softmax_run / "config.json").read_text() == config_before
    assert (softmax_run / "metrics.json").read_text() == metrics_before


def test_hparams_file_sets_the_run(tmp_path, capsys):
    hparams = tmp_path / "best_hparams.json"
    hparams.write_text(json.dumps({"hyperparameters": {"learning_rate": 0.002, "num_features": 8}, "trial_id": "0"}))
    out = tmp_path / "run"
    train_ok("--variant", "favor-absolute", *TINY, "--epochs", "1", "--hparams", hparams, "--num-features", "12", "--out", out)
    config = json.loads((out / "config.json").read_text())
    assert config["learning_rate"] == 0.002
    assert config["num_features"] == 12  # an explicit flag beats the file

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"learning_rat": 0.1}))
    code, last_line = train_fails(capsys, *TINY, "--hparams", bad, "--out", tmp_path / "other")
    assert code == 2 and "unknown keys ['learning_rat']" in last_line


def test_limit_all_lifts_the_limit_of_an_hparams_file(tmp_path):
    from experiments.cli import RUN_OPTIONS, parser
    from experiments.run_config import RunConfig

    hparams = tmp_path / "best_hparams.json"
    hparams.write_text(json.dumps({"limit": 400, "learning_rate": 0.002}))
    cli = parser("test", None, *RUN_OPTIONS, "hparams")

    def config(*args):
        return RunConfig.from_args(cli.parse_args(["--hparams", str(hparams), *args]))

    assert config().limit == 400
    assert config("--limit", "50").limit == 50
    lifted = config("--limit", "all")
    assert lifted.limit is None and lifted.learning_rate == 0.002
    with pytest.raises(SystemExit):
        cli.parse_args(["--limit", "0"])


@pytest.mark.parametrize("checkpoint", ["best.keras", "."])  # the checkpoint, or its run folder
def test_init_from_softmax_copies_shared_weights(softmax_run, tmp_path, checkpoint):
    import keras

    performer = tmp_path / "favor"
    train_ok("--variant", "favor-absolute", *TINY, "--epochs", "1", "--learning-rate", "1e-9",
             "--init-from", softmax_run / checkpoint, "--out", performer)
    record = json.loads((performer / "init_from.json").read_text())
    assert "block_0_attention/query/kernel" in record["copied"]
    assert "patch_embedding/kernel" in record["copied"]
    assert "block_0_attention/features/projection" in record["not_copied"]
    # With a vanishing learning rate the copied weights are still the softmax model's.
    source = keras.models.load_model(softmax_run / "best.keras")
    target = keras.models.load_model(performer / "best.keras")
    source_weights = {v.path: np.asarray(v) for v in source.weights}
    target_weights = {v.path: np.asarray(v) for v in target.weights}
    np.testing.assert_allclose(
        target_weights["block_0_attention/query/kernel"], source_weights["block_0_attention/query/kernel"], atol=1e-6
    )


def test_nan_loss_stops_with_a_message(tmp_path, capsys):
    code, last_line = train_fails(capsys, *TINY, "--epochs", "2", "--learning-rate", "1e30", "--out", tmp_path / "run")
    assert code == 3
    assert "NaN/Inf loss" in last_line
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_many_steps_per_dispatch_give_the_same_weights_as_one():
    from experiments import data, training
    from experiments.run_config import RunConfig

    # 22 steps an epoch: 11 per dispatch, over two epochs, with feature redraws every 7 steps.
    splits = data.load_dataset("mnist", limit=720)
    config = RunConfig(variant="favor-rope", size="tiny", batch_size=32, epochs=2, seed=3, limit=720,
                       redraw_interval=7)
    weights = []
    for per_dispatch in (None, 1):
        model = training.build_model(config, splits)
        if per_dispatch:
            model.compile(optimizer=training.build_optimizer(config, 22), loss="sparse_categorical_crossentropy",
                          metrics=["accuracy"], steps_per_execution=per_dispatch, jit_compile=model.jit_compile)
        else:
            assert model.steps_per_execution == 11
        training.fit_model(model, config, splits, [], 0, 0)
        weights.append(model.get_weights())
    for fast, slow in zip(*weights):
        np.testing.assert_array_equal(fast, slow)
    assert [training.steps_per_execution(n) for n in (22, 125, 175, 214, 429, 17)] == [11, 5, 7, 2, 13, 1]


def test_code_version_is_dirty_for_code_changes_not_for_results(tmp_path):
    from experiments.training import code_version

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "code.py").write_text("a = 1\n")
    (tmp_path / "results" / "log.txt").write_text("run 1\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "start")
    clean = code_version(tmp_path)
    assert len(clean) == 40 and not clean.endswith("+dirty")
    (tmp_path / "results" / "log.txt").write_text("run 2\n")  # a queue's log: data, not code
    assert code_version(tmp_path) == clean
    (tmp_path / "code.py").write_text("a = 2\n")
    assert code_version(tmp_path) == clean + "+dirty"
    assert code_version(tmp_path / "results") is not None  # a subfolder is still in the checkout


def test_the_stabilizer_reaches_every_favor_layer_and_old_folders_still_match():
    import keras

    import performer_keras
    from experiments.cli import RUN_OPTIONS, parser
    from experiments.run_config import RunConfig

    cli = parser("test", None, *RUN_OPTIONS)
    config = RunConfig.from_args(cli.parse_args(["--variant", "favor-absolute", "--size", "tiny", "--stabilizer", "logits"]))
    assert RunConfig.from_args(cli.parse_args(["--variant", "favor-absolute"])).stabilizer == "exponent"  # the default
    # A folder written before the option (or with the Performer's) has no stabilizer field, and it means "logits".
    recorded = config.to_dict()
    assert "stabilizer" not in recorded and RunConfig().to_dict()["stabilizer"] == "exponent"
    assert RunConfig.from_recorded(recorded) == config
    model = performer_keras.create_model(config.variant, **config.model_overrides())
    layers = [layer for layer in model.layers if isinstance(layer, performer_keras.KernelAttention)]
    assert layers and all(layer.features.stabilizer == "logits" for layer in layers)
    restored = keras.Model.from_config(model.get_config(), custom_objects=performer_keras.custom_objects())
    assert all(layer.features.stabilizer == "logits" for layer in restored.layers if hasattr(layer, "features"))


def test_a_tuner_s_hparams_file_repeats_its_trial_where_a_later_default_differs(tmp_path):
    from experiments.run_config import RunConfig

    # The tuner writes its trial's `to_dict`: a favor trial with the Performer's stabiliser and a normalised trial
    # at Luo et al.'s norm, neither written, as runs from before those options.
    trials = [RunConfig(variant="favor-absolute", stabilizer="logits"),
              RunConfig(variant="softmax-kerple", qk_norm=1.0, learn_qk_norm=False)]
    for trial in trials:
        best = tmp_path / "best_hparams.json"
        best.write_text(json.dumps({"hyperparameters": trial.to_dict(), "searched": ["learning_rate"]}))
        assert RunConfig.from_sources(best) == trial
    # A flat file names only what it sets: the rest are today's defaults.
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"variant": "favor-absolute", "learning_rate": 0.002}))
    assert RunConfig.from_sources(flat).stabilizer == "exponent"


def test_jit_compile_reaches_the_model_and_computes_the_same():
    from experiments import data, training
    from experiments.cli import RUN_OPTIONS, parser
    from experiments.run_config import RunConfig

    cli = parser("test", None, *RUN_OPTIONS)
    assert [RunConfig.from_args(cli.parse_args(args)).jit_compile
            for args in ([], ["--jit-compile"], ["--no-jit-compile"])] == [None, True, False]
    # Folders written before the option existed still match a config that leaves it to Keras.
    assert "jit_compile" not in RunConfig().to_dict() and RunConfig(jit_compile=True).to_dict()["jit_compile"] is True
    with pytest.raises(ValueError, match="jit_compile"):
        RunConfig(jit_compile="yes")
    splits = data.load_dataset("mnist", limit=320)
    images = splits.validation[0][:64]
    outputs, losses = [], []
    for jit_compile in (True, False):
        # The dense Toeplitz path (a gather of the bias table) under XLA. No feature redraws:
        # TensorFlow's stateless generator draws other numbers under XLA (README, --jit-compile).
        config = RunConfig(variant="favor-kerple", size="tiny", batch_size=32, epochs=1, seed=5, limit=320,
                           jit_compile=jit_compile)
        model = training.build_model(config, splits)
        assert model.jit_compile is jit_compile
        outputs.append(model.predict(images, verbose=0))
        history = training.fit_model(model, config, splits, [], 0, 0)
        losses.append(history.history["loss"][0])
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
    # Adam turns float-rounding differences of near-zero gradients into steps of the learning
    # rate, so single weights drift apart a little; the loss of the epoch does not.
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
