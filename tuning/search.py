"""A resumable KerasTuner search of one variant's hyperparameters.

A results folder (default ``tuning_results/<dataset>/<variant>``) holds:
    search.json        the search: fixed settings, space, algorithm, trial budget
                       (another search in the same folder is refused)
    keras_tuner/       KerasTuner's oracle state and trial_<id>/trial.json, plus
                       the trial's config.json (a RunConfig), history.csv, result.json
    tensorboard/       trial_<id>/: HParams and the epoch scalars of every trial
    trials.log         one line when a trial starts and one when it ends
    seeds/seed_<s>/    the best trial's config trained again with seed s (the confirmation)
    best_hparams.json  the best trial: {"hyperparameters": RunConfig, "val_accuracy", "trial_id",
                       "confirmation": its validation accuracy with the search's seed and 2 more}
    summary.md         every trial, sorted by validation accuracy, and the confirmation

Objective: the best validation accuracy over a trial's epochs, on the fixed
validation split that `data.load_dataset` draws from the training set; the
test split is never loaded into a trial.

Resuming: KerasTuner saves its oracle after every trial, and a search started
again with the same command reloads it (``overwrite=False``), so finished
trials are not run again and a trial cut short by a kill runs again from its
start. Every trial seeds Keras with its config's seed before it builds the
model, the input pipeline depends on (seed, epoch) only, the random and
Hyperband oracles draw from their saved seed state, and trials are re-read in
id order; so a resumed random or Hyperband search proposes and measures
exactly what an uninterrupted one would. A resumed Bayesian search keeps its
finished trials but may propose other points than an uninterrupted one:
KerasTuner does not save the random state of its acquisition optimizer.

Hyperband's trials are trained from scratch for their epoch budget, where
KerasTuner's own Hyperband tuner loads the parent trial's weights and trains
on: every trial here decays its learning rate to 0 over its own budget (the
warmup-cosine schedule of `train.py`), so a parent's final weights are an
annealed end point, not the middle of the child's schedule, and continuing
them would make a child a different recipe than the run `train.py --hparams`
repeats. Every trial, whatever the algorithm, is one complete `train.py` run.

All trials share the search seed (common random numbers): they differ in
their hyperparameters only, and `train.py --hparams best_hparams.json`
repeats the best trial, its initialization and data order included. Picking
the best of many single-seed trials favours a lucky one, so before
best_hparams.json is written the best trial's config is trained again with
the `CONFIRM_SEEDS` seeds after the search's, and the JSON reports all three.
"""

import dataclasses
import datetime
import json
import os
import shutil
import signal
from pathlib import Path

import keras
import keras_tuner
import numpy as np
from keras_tuner.src import utils as keras_tuner_utils

from experiments import atomic, data, event_logs, training
from performer_keras.options import check_choice
from tuning import search_spaces
from tuning.hypermodel import OBJECTIVE, VitHyperModel
from tuning.search_spaces import SearchError

ALGORITHMS = ("hyperband", "bayesian", "random")
# Extra seeds the best trial is trained with before best_hparams.json is written.
CONFIRM_SEEDS = 2
# Trials of bayesian and random search when --max-trials is not given;
# Hyperband then runs one full iteration of its brackets.
DEFAULT_MAX_TRIALS = 20
HYPERBAND_FACTOR = 3
PROJECT = "keras_tuner"
SEARCH_FILE = "search.json"
# Test hook, used by tests/test_tuning.py only: the process kills itself
# (SIGKILL, like `kill -9`) once this many trials have ended in it.
KILL_AFTER_TRIALS_ENV = "PERFORMER_KERAS_TEST_KILL_AFTER_TRIALS"


class SearchFailed(RuntimeError):
    """No trial finished; the folder keeps what ran (see its trial.json files)."""


@dataclasses.dataclass
class Search:
    """What defines a search; `search.json` holds `to_json()`.

    Args:
        base_config: the `RunConfig` of every trial before the sampled values
            (for Hyperband, `epochs` is the longest trial).
        space: {name: Range | Choice}, see `search_spaces`.
        algorithm: one of `ALGORITHMS`.
        max_trials: at most this many bayesian or random trials (None:
            `DEFAULT_MAX_TRIALS`); Hyperband runs one iteration of its brackets.
    """

    base_config: object
    space: dict
    algorithm: str = "hyperband"
    max_trials: int | None = None

    def __post_init__(self):
        try:
            check_choice("algorithm", self.algorithm, ALGORITHMS)
        except ValueError as error:
            raise SearchError(str(error)) from None
        if self.max_trials is not None and self.algorithm == "hyperband":
            raise SearchError("--max-trials caps bayesian and random searches; Hyperband's budget is one iteration "
                              "of its brackets up to --epochs (give --algorithm random or bayesian to cap trials)")
        if self.max_trials is None and self.algorithm != "hyperband":
            self.max_trials = DEFAULT_MAX_TRIALS
        if self.max_trials is not None and (
            isinstance(self.max_trials, bool) or not isinstance(self.max_trials, int) or self.max_trials < 1
        ):
            raise SearchError(f"--max-trials must be an integer >= 1, got {self.max_trials!r}")
        if not self.space:
            raise SearchError(f"the search space of {self.base_config.variant} is empty")

    def to_json(self):
        fixed = {k: v for k, v in self.base_config.to_dict().items() if k not in self.space}
        return {
            "objective": f"{OBJECTIVE} (best epoch, validation split)",
            "algorithm": self.algorithm,
            "max_trials": self.max_trials,
            "hyperband_factor": HYPERBAND_FACTOR if self.algorithm == "hyperband" else None,
            "fixed": fixed,
            "space": search_spaces.space_to_json(self.space),
        }


def default_out(config):
    return Path("tuning_results") / config.dataset / config.variant


def check_not_fixed(space, explicit):
    """Refuse a searched hyperparameter that a flag (e.g. --num-features) also fixes."""
    both = sorted(name for name in space if explicit.get(name) is not None)
    if both:
        name = both[0]
        raise SearchError(
            f"--{name.replace('_', '-')} fixes {name}, which the search varies; "
            f"give --space {name}={explicit[name]} to fix it"
        )


# === The results folder ===


def check_search_folder(search, out_dir):
    """Raise SearchError unless `out_dir` is new, empty, or holds this very search. Reads only."""
    out_dir = Path(out_dir)
    path = out_dir / SEARCH_FILE
    if path.exists():
        try:
            existing = _flatten(atomic.read_json_object(path))
        except ValueError as error:
            raise SearchError(f"{error}; choose another --out") from None
        wanted = _flatten(search.to_json())
        changed = sorted(k for k in set(existing) | set(wanted) if existing.get(k) != wanted.get(k))
        if changed:
            raise SearchError(
                f"{out_dir} holds a different search (differs in {changed}); choose another --out"
            )
    elif out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise SearchError(f"{out_dir} is not empty and holds no search; choose another --out")


def _flatten(value, prefix=""):
    """{"fixed": {"seed": 1}} -> {"fixed.seed": 1}, so a refusal names the settings that differ."""
    if not isinstance(value, dict):
        return {prefix: value}
    flat = {}
    for key, inner in value.items():
        flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
    return flat


# === One trial ===


def train_trial(hypermodel, hp, log_dir, csv_path, name, verbose=0):
    """Build and fit one trial from its seed; return the metrics of its best epoch.

    Writes HParams (run `name` on the dashboard) and scalars under `log_dir`
    and the epochs to `csv_path`.
    """
    config = hypermodel.trial_config(hp)
    shutil.rmtree(log_dir, ignore_errors=True)  # what a killed attempt left behind
    keras.backend.clear_session()
    with training.dtype_policy(config.precision):
        model = hypermodel.build(hp)
        training.log_hparams(log_dir, config, trial_id=name)
        history = hypermodel.fit(
            hp, model, verbose=verbose,
            # Epoch-end writers only (Keras' TensorBoard callback hooks every batch), so Keras dispatches
            # batches asynchronously, as in train.py.
            callbacks=[keras.callbacks.CSVLogger(csv_path), event_logs.EpochScalars(log_dir)],
        )
    return best_epoch(history.history)


def best_epoch(history):
    """The metrics of the first epoch with the highest validation accuracy."""
    scores = [-np.inf if np.isnan(v) else v for v in history[OBJECTIVE]]
    epoch = int(np.argmax(scores))
    metrics = {k: float(history[k][epoch]) for k in ("val_accuracy", "val_loss", "accuracy", "loss") if k in history}
    return dict(metrics, best_epoch=epoch + 1, seconds=float(sum(history.get("epoch_seconds", []))))


def _save_json_atomically(path, obj):
    """KerasTuner's `utils.save_json`, through `atomic`: the same text, renamed into place whole.

    KerasTuner writes its state (oracle.json, tuner0.json, every trial.json) through that one function, in
    place, so a kill during a write left a cut-off file that every rerun of the search failed to reload.
    """
    text = json.dumps(obj)
    atomic.write_text(path, text)
    return text


# KerasTuner is pinned in requirements.txt; tests/test_tuning.py kills a search inside an oracle write.
keras_tuner_utils.save_json = _save_json_atomically


class VitTuner(keras_tuner.Tuner):
    """KerasTuner's Tuner with a seeded, project-built trial (`train_trial`)."""

    def __init__(self, oracle, hypermodel, out_dir, **kwargs):
        self.out_dir = Path(out_dir)
        self.ended_here = 0
        super().__init__(oracle, hypermodel, directory=str(out_dir), project_name=PROJECT, overwrite=False, **kwargs)

    def reload(self):
        super().reload()
        # Trial files are read in directory order; id order is the order they ran
        # in, which is what the oracles see in an uninterrupted search. A trial the
        # oracle never recorded as started is left out: a kill between a new
        # trial's trial.json and the oracle's own save left one, which stayed
        # RUNNING without a score and took a trial of the budget, while the oracle,
        # reloaded from before it, drew its values again under the next id.
        started = set(self.oracle.start_order)
        self.oracle.trials = dict(sorted(((trial_id, trial) for trial_id, trial in self.oracle.trials.items()
                                          if trial_id in started), key=lambda item: int(item[0])))

    def run_trial(self, trial, *args, verbose=0, **kwargs):
        hp = trial.hyperparameters
        config = self.hypermodel.trial_config(hp)
        trial_dir = Path(self.get_trial_dir(trial.trial_id))
        atomic.write_json(trial_dir / "config.json", config.to_dict())
        values = {name: getattr(config, name) for name in sorted(self.hypermodel.space)}
        self.log(f"start trial {trial.trial_id} tuner={self.tuner_id} epochs={config.epochs} {json.dumps(values)}")
        metrics = train_trial(
            self.hypermodel, hp,
            log_dir=self.out_dir / "tensorboard" / f"trial_{trial.trial_id}",
            csv_path=trial_dir / "history.csv",
            name=f"{config.dataset}/{config.variant}/trial_{trial.trial_id}",
            verbose=2 if verbose else 0,  # one line per epoch
        )
        atomic.write_json(trial_dir / "result.json", metrics)
        return {k: v for k, v in metrics.items() if k in ("val_accuracy", "val_loss", "accuracy", "loss")}

    def on_trial_end(self, trial):
        super().on_trial_end(trial)  # saves the oracle: from here on the trial counts as run
        score = f" {OBJECTIVE}={trial.score:.4f}" if trial.score is not None else ""
        self.log(f"end trial {trial.trial_id} {trial.status}{score}")
        self.ended_here += 1
        if os.environ.get(KILL_AFTER_TRIALS_ENV) == str(self.ended_here):  # test hook, see above
            os.kill(os.getpid(), signal.SIGKILL)

    def log(self, line):
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        with open(self.out_dir / "trials.log", "a") as f:
            f.write(f"{stamp} {line}\n")


def make_oracle(search):
    objective = keras_tuner.Objective(OBJECTIVE, direction="max")
    # KerasTuner draws a random seed for 0; every seed maps to one >= 1.
    seed = search.base_config.seed % (2**31 - 1) + 1
    if search.algorithm == "random":
        return keras_tuner.oracles.RandomSearchOracle(objective=objective, max_trials=search.max_trials, seed=seed)
    if search.algorithm == "bayesian":
        try:
            return keras_tuner.oracles.BayesianOptimizationOracle(objective=objective, max_trials=search.max_trials,
                                                                  seed=seed)
        except ImportError:
            raise SearchError("--algorithm bayesian needs scikit-learn: pip install scikit-learn") from None
    return keras_tuner.oracles.HyperbandOracle(
        objective=objective, max_epochs=search.base_config.epochs, factor=HYPERBAND_FACTOR,
        hyperband_iterations=1, seed=seed,
    )


# === The search ===


def run_search(search, out_dir, verbose=1, splits=None):
    """Run (or resume) `search` in `out_dir`; write best_hparams.json and summary.md.

    `splits`: the loaded dataset, when the caller has it already.
    Returns {"best": row, "trials": [row, ...], "confirmation"} with rows
    as in `collect_trials`; None in a distributed search's worker
    (`distributed_role`), whose trials the chief collects.

    Raises:
        SearchError, RunError, DataError: bad input; nothing existing was touched.
        SearchFailed: no trial finished.
    """
    out_dir = Path(out_dir)
    role = distributed_role()
    check_search_folder(search, out_dir)
    config = search.base_config
    if splits is None:
        splits = data.load_dataset(config.dataset, limit=config.limit)
    hypermodel = VitHyperModel(config, search.space, splits)
    _check_trainable(hypermodel)
    oracle = make_oracle(search)

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out_dir / SEARCH_FILE, search.to_json())
    try:
        tuner = VitTuner(oracle, hypermodel, out_dir)
    except json.JSONDecodeError as error:  # damaged by hand or disk: its writes are atomic (_save_json_atomically)
        raise SearchError(f"KerasTuner's state in {out_dir / PROJECT} does not read ({error}); mend it or choose "
                          "another --out") from None
    tuner.search(verbose=verbose)
    if role == "worker":
        return None  # the chief holds the oracle: it summarises, confirms and writes best_hparams.json

    rows = collect_trials(tuner)
    completed = [row for row in rows if row["status"] == "COMPLETED"]
    write_summary(out_dir, search, rows)
    if not completed:
        raise SearchFailed(f"no trial of the search in {out_dir} finished; see {out_dir / PROJECT}/trial_*/trial.json")
    best = completed[0]
    seed = best["config"].seed
    scores = {seed: best[OBJECTIVE]}
    for extra in range(seed + 1, seed + 1 + CONFIRM_SEEDS):
        scores[extra] = retrain_best(out_dir, best, extra, splits, verbose=2 if verbose else 0)[OBJECTIVE]
    confirmation = confirmation_record(scores)
    write_summary(out_dir, search, rows, confirmation)
    atomic.write_json(out_dir / "best_hparams.json", {
        "hyperparameters": best["config"].to_dict(),
        OBJECTIVE: best[OBJECTIVE],
        "trial_id": best["trial_id"],
        "searched": sorted(search.space),
        "objective": f"{OBJECTIVE} (best epoch, validation split)",
        "confirmation": confirmation,
    })
    return {"best": best, "trials": rows, "confirmation": confirmation}


def retrain_best(out_dir, best, seed, splits, verbose=0):
    """Validation metrics of the best trial's config trained with `seed`; cached in seeds/seed_<s>/."""
    folder = Path(out_dir) / "seeds" / f"seed_{seed}"
    if (folder / "result.json").exists():
        return atomic.read_json_object(folder / "result.json")
    folder.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(best["config"], seed=seed)
    atomic.write_json(folder / "config.json", config.to_dict())
    metrics = train_trial(
        VitHyperModel(config, {}, splits), keras_tuner.HyperParameters(),
        log_dir=folder / "tensorboard", csv_path=folder / "history.csv",
        name=f"{config.dataset}/{config.variant}/trial_{best['trial_id']}/seed_{seed}",
        verbose=verbose,
    )
    atomic.write_json(folder / "result.json", metrics)  # last: the seed run counts as done
    return metrics


def confirmation_record(scores):
    """{"seeds", "val_accuracy": {seed: score}, "mean", "std"} of the best trial over its seeds (the search's first)."""
    values = list(scores.values())
    return {"seeds": list(scores), OBJECTIVE: {str(seed): score for seed, score in scores.items()},
            "mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else None,
            "note": "the search's own seed picked this trial among all, so its score is biased upward; "
                    "the other seeds are not"}


def distributed_role():
    """None, "chief" or "worker": KerasTuner's distributed mode, set by its environment variables.

    KERASTUNER_ORACLE_IP and KERASTUNER_ORACLE_PORT name the chief's oracle
    service; KERASTUNER_TUNER_ID is "chief" in the process that runs it and a
    unique name in each worker. The chief's `search` serves trials until the
    search is done; workers ask it for trials and train them.

    Raises SearchError where the variables cannot work together: without
    KERASTUNER_ORACLE_IP KerasTuner ignores the other two and tunes alone, so
    workers started so would each run the whole search into one folder; a
    missing or malformed port made KerasTuner raise a traceback or wait for ever.
    """
    address, port, tuner = (os.environ.get(f"KERASTUNER_{name}") for name in ("ORACLE_IP", "ORACLE_PORT", "TUNER_ID"))
    if address is None:
        given = [f"KERASTUNER_{name}" for name, value in (("ORACLE_PORT", port), ("TUNER_ID", tuner)) if value is not None]
        if given:
            raise SearchError(f"{' and '.join(given)} set without KERASTUNER_ORACLE_IP: a distributed search needs the "
                              f"chief's address too; unset {' and '.join(given)} to tune alone")
        return None
    if not address.strip():
        raise SearchError("KERASTUNER_ORACLE_IP is empty: give the chief's address, or unset it to tune alone")
    if port is None or not port.strip().isdigit() or not 0 < int(port) < 2**16:
        raise SearchError(f"KERASTUNER_ORACLE_PORT must be the chief's port, 1 to 65535, beside KERASTUNER_ORACLE_IP; "
                          f"got {port!r}")
    return "chief" if (tuner or "chief").startswith("chief") else "worker"


def _check_trainable(hypermodel):
    """Fail now, with one line, on what would make every trial fail."""
    config = hypermodel.base_config
    try:
        data.steps_per_epoch(len(hypermodel.splits.train[1]), config.batch_size)
        hp = keras_tuner.HyperParameters()
        hypermodel.build(hp)
    except ValueError as error:
        raise SearchError(str(error).splitlines()[0]) from None
    finally:
        keras.backend.clear_session()


def collect_trials(tuner):
    """One row per trial, best first: trial_id, status, val_accuracy, config, result."""
    rows = []
    for trial_id, trial in tuner.oracle.trials.items():
        result_path = Path(tuner.get_trial_dir(trial_id)) / "result.json"
        completed = trial.status == "COMPLETED" and trial.score is not None
        rows.append({
            "trial_id": trial_id,
            "status": trial.status,
            OBJECTIVE: float(trial.score) if completed else None,
            "config": tuner.hypermodel.trial_config(trial.hyperparameters.copy()),
            "result": atomic.read_json_object(result_path) if result_path.exists() else {},
        })
    # Ties go to the earlier trial, whatever order the trial files were read in.
    rows.sort(key=lambda row: (row[OBJECTIVE] is None, -(row[OBJECTIVE] or 0.0), int(row["trial_id"])))
    return rows


def write_summary(out_dir, search, rows, confirmation=None):
    """summary.md: the search, the best trial's confirmation over seeds, and a table of every trial, best first."""
    config = search.base_config
    names = sorted(search.space)
    done = sum(row["status"] == "COMPLETED" for row in rows)
    budget = search.max_trials if search.max_trials is not None else "one Hyperband iteration of"
    lines = [
        f"# Search: {config.variant} on {config.dataset}",
        "",
        f"{search.algorithm} search, {done} of {budget} trials completed; "
        f"objective: best {OBJECTIVE} over a trial's epochs, on the validation split.",
        "",
        "Searched:",
        "",
        *(f"- `{name}`: {search.space[name]}" for name in names),
        "",
        "Fixed: " + ", ".join(
            f"{k}={v}" for k, v in search.to_json()["fixed"].items()
            if k in ("size", "width", "depth", "heads", "mlp_dim", "patch_size", "epochs", "batch_size", "limit", "seed",
                     "precision", "dropout", "label_smoothing")
            and v is not None
        ),
        "",
    ]
    if rows and rows[0]["status"] == "COMPLETED":
        lines += [f"Best: trial {rows[0]['trial_id']}; retrain it with "
                  f"`python train.py --hparams {Path(out_dir) / 'best_hparams.json'}`", ""]
    if confirmation:
        seeds = ", ".join(f"seed {seed} {confirmation[OBJECTIVE][str(seed)]:.4f}" for seed in confirmation["seeds"])
        spread = f" ± {confirmation['std']:.4f}" if confirmation["std"] is not None else ""
        lines += [f"Confirmation of the best trial ({OBJECTIVE}): {seeds}; mean {confirmation['mean']:.4f}{spread}. "
                  f"The search's seed {confirmation['seeds'][0]} chose this trial among all, so its score is "
                  "optimistic; the others are not.", ""]
    header = ["rank", "trial", OBJECTIVE, *names, "epochs", "best epoch", "seconds", "status"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rank, row in enumerate(rows, 1):
        score = f"{row[OBJECTIVE]:.4f}" if row[OBJECTIVE] is not None else "-"
        result = row["result"]
        cells = [
            str(rank) if row[OBJECTIVE] is not None else "-", row["trial_id"], score,
            *(format_value(getattr(row["config"], name)) for name in names),
            str(row["config"].epochs), str(result.get("best_epoch", "-")),
            f"{result['seconds']:.1f}" if "seconds" in result else "-", row["status"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    atomic.write_text(Path(out_dir, "summary.md"), "\n".join(lines) + "\n")


def format_value(value):
    """A hyperparameter value for a Markdown table: floats to 3 significant digits."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)
