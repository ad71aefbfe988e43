"""The tuner on a real search: 3 trials of the tiny model on 300 MNIST images, 1 epoch each
(batch 150: two equal batches, so every trial compiles one train and one test step).

One search (the `search` fixture) is shared by most tests; the kill test runs
the same search again, killed after its first trial and resumed, and compares.
"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras_tuner
import pytest

from experiments import atomic
from experiments.run_config import RunConfig
from tuning import search_spaces
from tuning.__main__ import main as tune
from tuning.search import KILL_AFTER_TRIALS_ENV, SEARCH_FILE
from tuning.search_spaces import Choice, Range, SearchError

REPO_ROOT = Path(__file__).resolve().parent.parent
# Without XLA: compiling is most of a tiny trial's time (this search took 150-161 s with it and
# 67-71 s without, measured alternately on the 2-core CPU), and nothing the search does depends
# on it; tests/test_train.py checks that XLA reaches the model and computes the same.
# Regularisation joins the default space on request; dropout is never 0 here, so the best trial that
# train.py repeats below has dropout layers.
SEARCH = [
    "favor-rope", "--dataset", "mnist", "--size", "tiny", "--limit", "300", "--epochs", "1",
    "--batch-size", "150", "--algorithm", "random", "--max-trials", "3", "--no-jit-compile", "--quiet",
    "--space", "dropout=0.1:0.3", "--space", "label_smoothing=0,0.1",
]
SEARCHED = {"learning_rate", "weight_decay", "num_features", "redraw_interval", "dropout", "label_smoothing"}
TRIAL_IDS = ["0", "1", "2"]


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    out = tmp_path_factory.mktemp("tuning_results") / "favor-rope"
    assert tune([*SEARCH, "--out", str(out)]) == 0
    return out


def trial_json(out, trial_id):
    return json.loads((out / "keras_tuner" / f"trial_{trial_id}" / "trial.json").read_text())


def started_trials(out):
    return [line.split()[3] for line in (out / "trials.log").read_text().splitlines() if " start trial " in line]


def scores(out):
    return {t: (trial_json(out, t)["hyperparameters"]["values"], trial_json(out, t)["score"]) for t in TRIAL_IDS}


# === The search ===


@pytest.mark.slow  # the shared search fixture: about a minute on a 2-core CPU
def test_search_writes_every_trial(search):
    for trial_id in TRIAL_IDS:
        trial = trial_json(search, trial_id)
        assert trial["status"] == "COMPLETED"
        assert set(trial["hyperparameters"]["values"]) == SEARCHED
        assert 0.0 <= trial["score"] <= 1.0
    assert started_trials(search) == TRIAL_IDS
    assert not (search / "keras_tuner" / "trial_3").exists()


@pytest.mark.slow
def test_summary_lists_trials_sorted_by_validation_accuracy(search):
    rows = [line for line in (search / "summary.md").read_text().splitlines() if line.startswith("| ") and "COMPLETED" in line]
    assert len(rows) == 3
    accuracies = [float(row.split("|")[3]) for row in rows]
    assert accuracies == sorted(accuracies, reverse=True)
    best = json.loads((search / "best_hparams.json").read_text())
    assert best["val_accuracy"] == max(trial_json(search, t)["score"] for t in TRIAL_IDS)
    assert rows[0].split("|")[2].strip() == best["trial_id"]


@pytest.mark.slow
def test_every_trial_logs_hparams_and_scalars_for_tensorboard(search):
    import tensorflow as tf

    for trial_id in TRIAL_IDS:
        log_dir = search / "tensorboard" / f"trial_{trial_id}"
        plugins = set()
        for path in log_dir.glob("events.out.tfevents.*"):
            for event in tf.compat.v1.train.summary_iterator(str(path)):
                plugins.update(value.metadata.plugin_data.plugin_name for value in event.summary.value)
        assert "hparams" in plugins, f"no HParams in {log_dir}"
        assert list((log_dir / "validation").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_best_hparams_reproduce_the_trial_in_train_py(search, tmp_path):
    import train

    best_path = search / "best_hparams.json"
    best = json.loads(best_path.read_text())
    trial_dir = search / "keras_tuner" / f"trial_{best['trial_id']}"
    trial_config = RunConfig.from_recorded(json.loads((trial_dir / "config.json").read_text()))
    assert RunConfig.from_sources(best_path) == trial_config
    assert 0.1 <= trial_config.dropout <= 0.3
    assert best["hyperparameters"]["learning_rate"] == trial_json(search, best["trial_id"])["hyperparameters"]["values"]["learning_rate"]

    # train.py takes the file as it is and repeats the trial, numbers included.
    assert train.main(["--hparams", str(best_path), "--out", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == trial_config.to_dict()
    retrained = (tmp_path / "run" / "history.csv").read_text().splitlines()[1].split(",")
    in_search = (trial_dir / "history.csv").read_text().splitlines()[1].split(",")
    header = (trial_dir / "history.csv").read_text().splitlines()[0].split(",")
    column = header.index("val_accuracy")
    assert float(retrained[column]) == pytest.approx(best["val_accuracy"], abs=1e-6)
    assert float(in_search[column]) == pytest.approx(best["val_accuracy"], abs=1e-6)


@pytest.mark.slow  # a real process killed mid-search, like tests/test_kill.py: about a minute
def test_killed_search_resumes_without_rerunning_finished_trials(search, tmp_path):
    out = tmp_path / "favor-rope"
    command = [sys.executable, "-m", "tuning", *SEARCH, "--out", str(out)]
    env = dict(os.environ, **{KILL_AFTER_TRIALS_ENV: "1"})
    killed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert started_trials(out) == ["0"]
    assert trial_json(out, "0")["status"] == "COMPLETED"
    assert not (out / "best_hparams.json").exists()

    # The same command again (in this process, to save a TensorFlow start).
    assert tune([*SEARCH, "--out", str(out)]) == 0
    assert started_trials(out) == TRIAL_IDS  # trial 0 ran once
    assert scores(out) == scores(search)  # what an uninterrupted search found
    assert json.loads((out / "best_hparams.json").read_text()) == json.loads((search / "best_hparams.json").read_text())


@pytest.mark.slow  # a real process stopped inside a write and killed, like tests/test_kill.py
def test_a_search_killed_inside_a_write_of_kerastuner_s_state_resumes(search, tmp_path):
    # KerasTuner wrote oracle.json and trial.json in place: a kill there left a cut-off file that no rerun loaded.
    out = tmp_path / "favor-rope"
    env = dict(os.environ, **{atomic.PAUSE_VARIABLE: "oracle.json:4"})
    process = subprocess.Popen([sys.executable, "-m", "tuning", *SEARCH, "--out", str(out)], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    try:
        while time.time() < deadline and process.poll() is None and not atomic.paused_under(out):
            time.sleep(0.05)
        assert atomic.paused_under(out), "the search never reached the oracle's fourth write"
    finally:
        process.kill()
        process.wait()
    assert not (out / "best_hparams.json").exists()
    assert tune([*SEARCH, "--out", str(out)]) == 0
    assert scores(out) == scores(search)
    assert json.loads((out / "best_hparams.json").read_text()) == json.loads((search / "best_hparams.json").read_text())


@pytest.mark.slow
def test_kerastuner_state_that_does_not_read_is_refused_in_one_line(search, tmp_path, capsys):
    out = tmp_path / "favor-rope"
    shutil.copytree(search, out)
    (out / "keras_tuner" / "trial_1" / "trial.json").write_text("{")  # a traceback from KerasTuner before
    capsys.readouterr()
    assert tune([*SEARCH, "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"python -m tuning: error: KerasTuner's state in {out / 'keras_tuner'} does not read (Expecting property name "
        "enclosed in double quotes: line 1 column 2 (char 1)); mend it or choose another --out"]


@pytest.mark.slow
def test_the_best_trial_is_confirmed_on_two_more_seeds_before_best_hparams(search):
    best = json.loads((search / "best_hparams.json").read_text())
    seed = best["hyperparameters"]["seed"]
    confirmation = best["confirmation"]
    assert confirmation["seeds"] == [seed, seed + 1, seed + 2]
    assert confirmation["val_accuracy"][str(seed)] == best["val_accuracy"]
    for extra in (seed + 1, seed + 2):
        folder = search / "seeds" / f"seed_{extra}"
        result = json.loads((folder / "result.json").read_text())
        assert confirmation["val_accuracy"][str(extra)] == result["val_accuracy"]
        # The same config as the best trial but for the seed.
        config = json.loads((folder / "config.json").read_text())
        assert {**config, "seed": seed} == best["hyperparameters"]
    values = list(confirmation["val_accuracy"].values())
    assert confirmation["mean"] == pytest.approx(sum(values) / 3)
    assert "Confirmation of the best trial" in (search / "summary.md").read_text()


@pytest.mark.slow
def test_finished_search_run_again_runs_nothing(search):
    before = (search / "trials.log").read_text()
    assert tune([*SEARCH, "--out", str(search)]) == 0
    assert (search / "trials.log").read_text() == before


def free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_a_chief_and_two_workers_share_one_search_and_a_dead_worker_resumes_its_trial(search, tmp_path):
    # KerasTuner's distributed mode on one machine: a chief serving the oracle, two workers.
    out = tmp_path / "favor-rope"
    command = [sys.executable, "-m", "tuning", *SEARCH, "--out", str(out)]
    env = dict(os.environ, KERASTUNER_ORACLE_IP="127.0.0.1", KERASTUNER_ORACLE_PORT=str(free_port()))

    def start(tuner_id):
        return subprocess.Popen(command, cwd=REPO_ROOT, env=dict(env, KERASTUNER_TUNER_ID=tuner_id),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    chief, worker0 = start("chief"), start("worker0")
    # worker0 dies (SIGKILL) inside its first trial, before anyone else takes a trial.
    deadline = time.monotonic() + 300
    while not ((out / "trials.log").exists() and "tuner=worker0" in (out / "trials.log").read_text()):
        assert time.monotonic() < deadline and worker0.poll() is None, worker0.stdout.read()[-2000:]
        time.sleep(0.05)
    worker0.kill()
    worker0.wait()
    (killed,) = started_trials(out)
    # Restarted with the same id, a worker gets its unfinished trial back; worker1 takes the others.
    workers = [start("worker0"), start("worker1")]
    outputs = []
    for process in workers + [chief]:
        outputs.append(process.communicate(timeout=600)[0])
        assert process.returncode == 0, outputs[-1][-2000:]
    assert all("no trials left" in output for output in outputs[:2]) and "best: trial" in outputs[2]
    starts = started_trials(out)
    assert sorted(starts) == sorted(TRIAL_IDS + [killed]) and starts.count(killed) == 2
    # The same trials and scores as the search in one process, and the chief confirmed and wrote the results.
    assert scores(out) == scores(search)
    assert json.loads((out / "best_hparams.json").read_text()) == json.loads((search / "best_hparams.json").read_text())


# === Bad input: one line, exit code 2, nothing touched ===


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("argv, message", [
    (["bogus-rope"], "Unknown attention 'bogus'"),
    (["favor-rope", "--space", "num_features="], "space of num_features is empty"),
    (["favor-rope", "--space", "learning_rate=1e-3:1e-4"], "range of learning_rate is empty"),
    (["softmax-rope", "--space", "num_features=32,64"], "does not use num_features"),
    (["favor-rope", "--num-features", "32"], "--space num_features=32"),
    (["softmax-rope", "--dropout", "0.1", "--space", "dropout=0:0.3"], "--space dropout=0.1"),
    (["softmax-rope", "--space", "dropout=0.5:1"], "dropout must be in [0, 1)"),
    (["favor-rope", "--space", "momentum=0.9"], "Unknown hyperparameter 'momentum'"),
    (["favor-rope", "--max-trials", "0"], "argument --max-trials: expected a whole number >= 1"),
    (["favor-rope", "--max-trials", "5"], "--max-trials caps bayesian and random searches"),
    (["favor-rope", "--algorithm", "grid"], "Unknown algorithm 'grid'"),
    (["favor-rope", "--epochs", "many"], "argument --epochs: expected a whole number >= 1, got 'many'"),
    ([], "give a VARIANT"),
    (["softmax-rope", "--num-features", "32"], "--num-features changes nothing in softmax-rope; it applies to favor, relu"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, message, capsys, tmp_path):
    try:
        code = tune([*argv, "--out", str(tmp_path / "out")])
    except SystemExit as exit:  # argparse's own, one line (experiments.cli.OneLineParser)
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m tuning: error: ") and message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("environment, message", [
    # KerasTuner tuned alone here: workers started so each ran the whole search into the same folder.
    (dict(KERASTUNER_TUNER_ID="worker0"), "KERASTUNER_TUNER_ID set without KERASTUNER_ORACLE_IP"),
    (dict(KERASTUNER_ORACLE_PORT="8000", KERASTUNER_TUNER_ID="chief"),
     "KERASTUNER_ORACLE_PORT and KERASTUNER_TUNER_ID set without KERASTUNER_ORACLE_IP"),
    # KerasTuner raised a traceback here, and waited for ever on a port it could not read.
    (dict(KERASTUNER_ORACLE_IP="127.0.0.1"), "KERASTUNER_ORACLE_PORT must be the chief's port, 1 to 65535, beside "
                                               "KERASTUNER_ORACLE_IP; got None"),
    (dict(KERASTUNER_ORACLE_IP="127.0.0.1", KERASTUNER_ORACLE_PORT="abc"), "got 'abc'"),
    (dict(KERASTUNER_ORACLE_IP="127.0.0.1", KERASTUNER_ORACLE_PORT="65536"), "got '65536'"),
    (dict(KERASTUNER_ORACLE_IP=" ", KERASTUNER_ORACLE_PORT="8000"), "KERASTUNER_ORACLE_IP is empty"),
])
def test_a_distributed_search_refuses_variables_that_cannot_work_together(environment, message, capsys, tmp_path,
                                                                          monkeypatch):
    for name in ("KERASTUNER_ORACLE_IP", "KERASTUNER_ORACLE_PORT", "KERASTUNER_TUNER_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert tune(["favor-rope", "--size", "tiny", "--limit", "300", "--epochs", "1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m tuning: error: ") and message in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("change", [["--max-trials", "4"], ["--seed", "7"], ["--space", "num_features=32,64"]])
def test_a_different_search_in_the_same_folder_is_refused(search, change, capsys):
    before = snapshot(search)
    assert tune([*SEARCH, *change, "--out", str(search)]) == 2  # the last --max-trials counts
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a different search" in err
    assert snapshot(search) == before


def test_a_sweep_refuses_a_flag_that_none_of_its_variants_reads(tmp_path, capsys):
    from tuning.sweep import main as sweep

    flags = [*SEARCH[1:], "--no-orthogonal", "--out", str(tmp_path)]
    assert sweep(["--variants", "softmax-rope", "exp-rope", *flags]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m tuning.sweep: error: no variant of the sweep reads ['--orthogonal']")
    # favor-rope reads it, so the sweep takes it (softmax-rope ignores it) and goes on to its folders.
    (tmp_path / "softmax-rope").mkdir()
    (tmp_path / "softmax-rope" / "notes.txt").write_text("mine")
    assert sweep(["--variants", "softmax-rope", "favor-rope", *flags]) == 2
    assert "holds no search" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["softmax-rope"]


def test_a_folder_that_holds_something_else_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert tune([*SEARCH, "--out", str(tmp_path)]) == 2
    assert "holds no search" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


# === Spaces ===


def test_each_kernel_searches_only_what_it_uses():
    def names(**kwargs):
        return set(search_spaces.space_for(RunConfig(**kwargs)))

    optimizer = {"learning_rate", "weight_decay"}
    assert names(variant="softmax-rope") == optimizer
    assert names(variant="exp-absolute") == optimizer
    assert names(variant="favor-rope") == optimizer | {"num_features", "redraw_interval"}
    assert names(variant="relu-kerple") == optimizer | {"num_features"}
    assert names(variant="relu-kerple", deterministic=True) == optimizer
    space = search_spaces.space_for(RunConfig(variant="favor-rope"))
    assert space["learning_rate"] == Range(1e-4, 3e-3)
    assert space["num_features"] == Choice((16, 32, 64, 128, 256))


def test_a_registered_kernel_that_searches_an_option_without_a_range_is_told_in_one_line():
    from performer_keras.registry import KERNEL_TABLE, Kernel, register_kernel

    register_kernel("favor2", Kernel("favor_features:FavorFeatures", ("num_features", "stabilizer"), searched=("stabilizer",)))
    try:  # a KeyError: 'stabilizer'
        with pytest.raises(search_spaces.SearchError, match=r"kernel 'favor2' searches \['stabilizer'\], which have no range"):
            search_spaces.space_for(RunConfig(variant="favor2-rope"))
    finally:
        del KERNEL_TABLE["favor2"]


def test_every_variant_searches_regularisation_only_when_asked():
    overrides = search_spaces.parse_overrides(["dropout=0:0.3", "label_smoothing=0,0.1"])
    assert overrides == {"dropout": Range(0.0, 0.3, "linear"), "label_smoothing": Choice((0.0, 0.1))}
    for variant in ("softmax-absolute", "favor-rope", "linformer-string"):
        config = RunConfig(variant=variant)
        assert not {"dropout", "label_smoothing"} & set(search_spaces.space_for(config))
        space = search_spaces.space_for(config, overrides)
        assert space["dropout"] == Range(0.0, 0.3, "linear") and space["label_smoothing"] == Choice((0.0, 0.1))
    # A fraction's range reads back from search.json's form; its draws stay in [low, high].
    assert search_spaces.parse_dimension("dropout", {"uniform": [0, 0.3]}) == Range(0.0, 0.3, "linear")
    hp = keras_tuner.HyperParameters()
    drawn = Range(0.0, 0.3, "linear").declare(hp, "dropout")
    assert 0.0 <= drawn <= 0.3 and hp.space[0].sampling == "linear"
    assert str(Range(0.0, 0.3, "linear")) == "0:0.3 (uniform)"
    for bad, message in [
        ("dropout=1", "dropout must be in [0, 1)"),
        ("dropout=0:1", "dropout must be in [0, 1)"),
        ("label_smoothing=-0.1:0.1", "label_smoothing must be in [0, 1)"),
        ("dropout=0.3:0.1", "range of dropout is empty"),
        ("learning_rate=0:1e-3", "log-uniform range of learning_rate needs 0 < low"),
        ("learning_rate=1e-3:inf", "learning_rate takes finite values, got 'inf'"),
        ("weight_decay=0.1,inf", "weight_decay takes finite values, got 'inf'"),
        ("dropout=nan", "dropout takes finite values, got 'nan'"),
    ]:
        with pytest.raises(SearchError, match=re.escape(message)):
            search_spaces.parse_overrides([bad])
    for name, value, message in [
        ("dropout", {"log_uniform": [0.1, 0.3]}, "dropout takes a uniform range, not log_uniform"),
        ("learning_rate", {"uniform": [1e-4, 1e-3]}, "learning_rate takes a log_uniform range, not uniform"),
        ("num_features", {"uniform": [16, 64]}, "num_features takes a list of values, not uniform"),
        ("learning_rate", {"log_uniform": [1e-4, float("inf")]}, "learning_rate takes finite values, got inf"),
    ]:
        with pytest.raises(SearchError, match=re.escape(message)):
            search_spaces.parse_dimension(name, value)


def test_a_diverged_trial_ends_after_its_epoch_without_holding_keras_to_every_batch(monkeypatch, tmp_path):
    import keras

    from experiments import data, training
    from tuning.hypermodel import VitHyperModel
    from tuning.search import train_trial

    splits = data.load_dataset("mnist", limit=300)
    config = RunConfig(variant="favor-rope", size="tiny", limit=300, batch_size=150, epochs=4,
                       learning_rate=1e30, jit_compile=False)
    callbacks = []
    fit = training.fit_model

    def recording_fit(model, config, splits, given, **kwargs):
        callbacks.extend(given)
        return fit(model, config, splits, given, **kwargs)

    monkeypatch.setattr(training, "fit_model", recording_fit)
    metrics = train_trial(VitHyperModel(config, {}, splits), keras_tuner.HyperParameters(),
                          log_dir=tmp_path / "tensorboard", csv_path=tmp_path / "history.csv", name="diverged")
    header, *epochs = (tmp_path / "history.csv").read_text().splitlines()
    losses = [float(epoch.split(",")[header.split(",").index("loss")]) for epoch in epochs]
    # No error: the trial stopped at the end of its first epoch with a NaN loss, before its budget of 4.
    assert len(losses) < 4 and math.isnan(losses[-1]) and not any(map(math.isnan, losses[:-1]))
    assert metrics["best_epoch"] >= 1
    # Only epoch-end hooks: a batch hook (Keras' TerminateOnNaN or TensorBoard callbacks) makes Keras
    # wait for the device every step and turns its asynchronous dispatch off.
    assert callbacks
    for callback in callbacks:
        for hook in ("on_batch_end", "on_train_batch_end"):
            assert getattr(type(callback), hook) is getattr(keras.callbacks.Callback, hook), (callback, hook)
    assert list((tmp_path / "tensorboard" / "validation").glob("events.out.tfevents.*"))


def test_spaces_narrow_and_widen_from_the_command_line_and_a_file(tmp_path):
    path = tmp_path / "space.json"
    path.write_text(json.dumps({"learning_rate": "1e-5:1e-2", "num_features": [64, 32], "redraw_interval": 0}))
    overrides = search_spaces.parse_overrides(["num_features=128"], path)
    assert overrides == {
        "learning_rate": Range(1e-5, 1e-2),
        "num_features": Choice((128,)),
        "redraw_interval": Choice((0,)),
    }
    space = search_spaces.space_for(RunConfig(variant="favor-rope"), overrides)
    # search.json's form of a space reads back as the same space.
    path.write_text(json.dumps(search_spaces.space_to_json(space)))
    assert search_spaces.parse_overrides((), path) == space
    for bad in (["num_features=16:64"], ["num_features=0"], ["num_features=32,32"], ["weight_decay=-1"], ["learning_rate"]):
        with pytest.raises(SearchError):
            search_spaces.parse_overrides(bad)
    # The file's value yields to the command line's, but two on the command line are refused: the later one
    # silently replaced the earlier.
    assert search_spaces.parse_overrides(["num_features=16"], path)["num_features"] == Choice((16,))
    with pytest.raises(SearchError, match=re.escape("--space gives num_features twice; give its values once")):
        search_spaces.parse_overrides(["num_features=32", " num_features =64"])
    path.write_text('{"learning_rate": [1e-3, Infinity]}')  # Python's json reads JSON's Infinity as inf
    with pytest.raises(SearchError, match="learning_rate takes finite values, got inf"):
        search_spaces.parse_overrides((), path)


@pytest.mark.slow
def test_search_json_describes_the_search(search):
    described = json.loads((search / SEARCH_FILE).read_text())
    assert described["algorithm"] == "random" and described["max_trials"] == 3
    assert described["fixed"]["variant"] == "favor-rope" and described["fixed"]["limit"] == 300
    assert set(described["space"]) == SEARCHED
    assert described["space"]["dropout"] == {"uniform": [0.1, 0.3]}
    assert "learning_rate" not in described["fixed"]


# === Sweep ===


@pytest.mark.slow
def test_sweep_compares_best_settings_with_their_seed_spread(search, capsys):
    from tuning.sweep import main as sweep

    # The fixture's search is the favor-rope search of this sweep: it resumes, runs no trial.
    root = search.parent
    before = (search / "trials.log").read_text()
    assert sweep(["--variants", "favor-rope", *SEARCH[1:], "--seeds", "42", "43", "--out", str(root)]) == 0
    assert (search / "trials.log").read_text() == before
    rows = json.loads((root / "sweep.json").read_text())
    assert [row["variant"] for row in rows] == ["favor-rope"]
    assert set(rows[0]["seed_val_accuracy"]) == {"42", "43"}
    assert rows[0]["val_accuracy"] == json.loads((search / "best_hparams.json").read_text())["val_accuracy"]
    assert (search / "seeds" / "seed_43" / "result.json").exists()
    table = (root / "sweep.md").read_text()
    assert "| favor-rope |" in table and "mean ± std (2 seeds)" in table

    assert sweep(["--variants", "softmax-rope", *SEARCH[1:], "--space", "num_features=32", "--out", str(root)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "python -m tuning.sweep: error: no variant of the sweep uses ['num_features']"
