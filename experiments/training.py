"""Train one variant into a crash-safe run folder.

A run folder holds:
    config.json      the `RunConfig` (a different config in the same folder is refused)
    history.csv      one row per finished epoch (accuracy, loss, val_*, learning_rate, epoch_seconds)
    best.keras       the best checkpoint by validation accuracy
    backup/          the kill-safe training state while the run is unfinished (checkpoints.py)
    epochs/          the weights of the epochs `keep_epochs` named (`--keep-epochs`), kept after the run
    provenance.json  the commit and backend of each training session (a resumed run lists several)
    logs/            TensorBoard scalars and HParams
    throughput.json  images/s of the input pipeline alone and of training
    init_from.json   which weights `init_from` copied (when used)
    metrics.json     written by `evaluation.evaluate` once training ends

Resuming: killed at any moment, the same call restarts from the last finished
epoch. The data order and augmentation of epoch k depend only on (seed, k)
(`pipelines.train_batches(start_epoch=k)`), the backup restores weights, optimizer
state and the random features' seed state, and the history and best-checkpoint
threshold are cut back to that epoch, so the run ends with the same metrics as
an uninterrupted one.
"""

import contextlib
import math
import subprocess
import sys
import time
from pathlib import Path

import keras

from experiments import checkpoints, data, event_logs, history, pipelines
from experiments.atomic import read_json_object, write_json
from experiments.latency import cpu_identity, device_name
from experiments.metrics import read_metrics
from experiments.models import first_line, load_model_only
from performer_keras.registry import create_model, model_config
from performer_keras.smoothed_sparse_crossentropy import SmoothedSparseCrossentropy
from experiments.run_config import RunError, check_keep_epochs


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf; the last good checkpoint is kept."""


class StopOnNaN(keras.callbacks.Callback):
    """End training at the end of an epoch whose mean loss is NaN or Inf.

    Per epoch, not per batch like Keras' TerminateOnNaN: a batch hook makes
    Keras wait for the device every step and turns off its asynchronous
    dispatch. One NaN step makes the epoch's mean NaN, so nothing is missed.

    With `out_dir` (a run folder) it raises `TrainingDiverged`; placed before
    the writers it keeps the diverged epoch out of the history, the best
    checkpoint and the backup. Without (a tuner trial) it stops training
    quietly: a diverged trial is a bad trial that keeps its best epoch, not an error.
    """

    def __init__(self, out_dir=None):
        super().__init__()
        self.out_dir = None if out_dir is None else Path(out_dir)

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(float(loss)):
            return
        if self.out_dir is None:
            self.model.stop_training = True
        else:
            raise TrainingDiverged(
                f"training diverged (NaN/Inf loss) in epoch {epoch + 1}; the last good checkpoint is kept in "
                f"{self.out_dir / 'best.keras'} and the backup in {self.out_dir / 'backup'}"
            )


class EpochStats(keras.callbacks.Callback):
    """Add `learning_rate` and `epoch_seconds` to the epoch logs (before the history is written)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        logs["epoch_seconds"] = time.perf_counter() - self.start
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


def check_run_folder(config, out_dir):
    """Check that `out_dir` may hold this run (absent, empty, or this very run); writes nothing.

    A folder holding only a config.json never trained (a start that failed
    before its first epoch, with older code): it is taken over, so the
    corrected command is not refused. Temporary files are writes a kill cut
    short, never a run.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise RunError(f"{out_dir} is a file, not a run folder; choose another --out")
    config_path = out_dir / "config.json"
    content = [f.name for f in out_dir.iterdir() if not f.name.startswith(".tmp-")] if out_dir.exists() else []
    if config_path.exists() and content != ["config.json"]:
        try:
            existing = read_json_object(config_path)
        except ValueError as error:
            raise RunError(f"{error}; choose another --out") from None
        if existing != config.to_dict():
            changed = sorted(k for k in set(existing) | set(config.to_dict()) if existing.get(k) != config.to_dict().get(k))
            raise RunError(f"{out_dir} holds a different run (differs in {changed}); choose another --out")
    elif content and content != ["config.json"]:
        raise RunError(f"{out_dir} is not empty and holds no run; choose another --out")
    return out_dir


def check_export_folder(export_dir, out_dir):
    """An export goes into an absent or empty folder, or over an earlier export of the same run (`EXPORT_RECORD`),
    on a machine with TensorFlow."""
    from experiments.export import read_export_record, tensorflow_missing

    missing = tensorflow_missing("--export (a TensorFlow SavedModel)")
    if missing:
        raise RunError(missing)
    export_dir = Path(export_dir)
    if export_dir.exists() and not export_dir.is_dir():
        raise RunError(f"--export {export_dir} is a file; give a folder")
    run, export = Path(out_dir).resolve(), export_dir.resolve()
    # Inside the run folder the SavedModel would mix with the run's own files (in backup/ it made the finished
    # run train again from the start); `export/` is the place evaluate.py checks it against the run.
    if export in (run, *run.parents) or (run in export.parents and export != run / "export"):
        raise RunError(f"--export {export_dir} {'holds' if export in (run, *run.parents) else 'is inside'} the run "
                       f"folder {out_dir}; give {Path(out_dir) / 'export'} or a folder outside it")
    if not export_dir.is_dir() or not any(export_dir.iterdir()):
        return
    try:
        exported_from = read_export_record(export_dir)[0]
    except ValueError as error:
        raise RunError(f"--export {export_dir}: {error}; choose another folder") from None
    if exported_from != str(Path(out_dir).resolve()):
        whose = f"an export of {exported_from}" if exported_from else "files that are no export of this run"
        raise RunError(f"--export {export_dir} holds {whose}; choose another folder")


def code_version(repo=Path(__file__).resolve().parent.parent):
    """The git commit of the checkout `repo` (this code's by default), "+dirty" with uncommitted changes
    outside results/; None outside a checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        # Results are data, not code: a queue writing its log into results/ is no dirty checkout.
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
                                cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode != 0:
        return None
    return commit.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def record_provenance(out_dir, start_epoch, jit_compile):
    """Append which code (commit), backend, device, CPU and XLA setting trained epochs from `start_epoch` on to
    provenance.json.

    `jit_compile` is the model's resolved setting: a config that leaves it
    to the default (None) says nothing about what ran. The device (as
    metrics.json will name it) lets an unfinished run's epochs forecast its
    own remaining time (`forecast.timing`); the CPU's family and model
    (`latency.cpu_identity`) tell apart machines that share that name.
    """
    path = Path(out_dir) / "provenance.json"
    try:
        sessions = read_json_object(path).get("sessions") if path.exists() else []
        if not isinstance(sessions, list):
            raise ValueError(f"{path} holds no list of sessions")
    except ValueError as error:
        raise RunError(f"{error}: the record of which code trained this run's epochs; mend it or remove it "
                       "(a new one then lists this session alone)") from None
    sessions.append({"commit": code_version(), "start_epoch": start_epoch, "keras_backend": keras.backend.backend(),
                     "device": device_name(), "cpu": cpu_identity(), "jit_compile": bool(jit_compile)})
    write_json(path, {"sessions": sessions})


def load_checkpoint(checkpoint):
    """The model saved in `checkpoint`, a .keras file or a run folder (its best.keras); RunError (one line) if it
    cannot be read."""
    # Keras reports a missing file as "File format not supported", which sends a user looking at the wrong thing.
    if not Path(checkpoint).exists():
        raise RunError(f"cannot read --init-from checkpoint {checkpoint}: no such file or folder")
    if Path(checkpoint).is_dir():
        if not (Path(checkpoint) / "best.keras").is_file():
            raise RunError(f"cannot read --init-from checkpoint {checkpoint}: a folder without best.keras "
                           "(give a run folder or a .keras file)")
        checkpoint = Path(checkpoint) / "best.keras"
    try:
        return load_model_only(checkpoint)
    except Exception as error:  # any unreadable file is a user error
        raise RunError(f"cannot read --init-from checkpoint {checkpoint}: {type(error).__name__}: {error}".splitlines()[0]) from None


def copy_shared_weights(model, source, checkpoint, partial=False):
    """Copy every variable of `source` whose path and shape match one of `model`.

    Starting a Performer from a trained softmax ViT shares everything but the
    kernel's own state (random projections, position parameters), so every
    weight of the source finds its place. A source of another size or
    architecture would give only a few: that is refused (RunError) unless
    `partial`, so a wrong checkpoint never starts a run silently.
    """
    source_vars = {v.path: v for v in source.weights}
    copied, kept = [], []
    for variable in model.weights:
        match = source_vars.get(variable.path)
        if match is not None and tuple(match.shape) == tuple(variable.shape) and match.dtype == variable.dtype:
            variable.assign(match.value)
            copied.append(variable.path)
        else:
            kept.append(variable.path)
    unused = sorted(set(source_vars) - set(copied))
    if unused and not partial:
        raise RunError(f"--init-from {checkpoint}: only {len(copied)} of its {len(source_vars)} weights match this "
                       f"model (first unused: {unused[0]}); give --init-from-partial to start from them anyway")
    return {"checkpoint": str(checkpoint), "copied": copied, "not_copied": kept, "unused_in_checkpoint": unused}


# The metric columns of the HParams dashboard: (tag, run subfolder of logs/) as Keras'
# TensorBoard callback and `evaluation.log_test_metrics` write them.
HPARAMS_METRICS = (("epoch_accuracy", "train"), ("epoch_accuracy", "validation"), ("test_accuracy", "test"))


def hparams_values(config):
    """The run's hyperparameters as TensorBoard shows them: the model size resolved to its
    effective width, depth, heads, MLP and patch, and unset options left out (never "None")."""
    values = dict(config.to_dict(), **model_config(**config.model_overrides()))
    return {key: value for key, value in values.items() if isinstance(value, (bool, int, float, str))}


def log_hparams(log_dir, config, trial_id=None):
    """Write the run's hyperparameters, and the experiment's columns, for TensorBoard's HParams dashboard.

    `trial_id` names the run in the dashboard (default: the run folder's name);
    the tuner passes ids that stay unique across variants and datasets, so its
    trials and train.py's runs share one table under one log root.
    """
    event_logs.write_hparams(log_dir, hparams_values(config), HPARAMS_METRICS,
                             trial_id=trial_id or Path(log_dir).parent.name)


def build_optimizer(config, steps_per_epoch):
    """AdamW with linear warmup then cosine decay over the whole run."""
    total = steps_per_epoch * config.epochs
    warmup = min(int(config.warmup_epochs * steps_per_epoch), total - 1)
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else config.learning_rate,
        decay_steps=total - warmup,
        warmup_target=config.learning_rate if warmup else None,
        warmup_steps=warmup,
    )
    return keras.optimizers.AdamW(learning_rate=schedule, weight_decay=config.weight_decay)


def use_compilation_cache():
    """On JAX, keep compiled programs in ``~/.cache/performer_keras/jax`` (delete it at will).

    A run compiles its train, validation and test steps again in every
    process; with the cache a resumed run, a rerun and the next seed of a row
    load them instead (JAX's persistent cache, keyed by the program and the
    device). TensorFlow has no such cache: a no-op there.
    """
    if keras.backend.backend() == "jax":
        import jax

        jax.config.update("jax_compilation_cache_dir", str(data.CACHE_DIR / "jax"))


def check_distribution(kind, batch_size):
    """RunError unless `kind` ("none" or "data") can train batches of `batch_size` here."""
    if kind == "none":
        return
    if keras.backend.backend() != "jax":
        raise RunError(f"--distribute {kind} needs KERAS_BACKEND=jax (Keras' DataParallel), not "
                       f"{keras.backend.backend()}")
    devices = len(keras.distribution.list_devices())
    if batch_size % devices:
        raise RunError(f"--distribute data splits each batch over {devices} devices: --batch-size {batch_size} "
                       "is not a multiple of that")


@contextlib.contextmanager
def distribution(kind):
    """Keras' distribution inside the block: "data" is `DataParallel` over every local device.

    Each global batch is split across the devices and the gradients are
    averaged, so a run matches a one-device run of the same batch to float
    tolerance (tests/test_no_tensorflow.py, two virtual CPU devices).
    Not part of the run's config: a run may resume on another machine.
    """
    if kind == "none":
        yield
        return
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


def train(config, out_dir, verbose="auto", export_dir=None, distribute="none", keep_epochs=()):
    """Train `config` into `out_dir` (resuming if unfinished) and return its metrics.

    `distribute` "data" trains on every local device (`distribution`).
    `keep_epochs` (1-based) keeps those epochs' weights in `out_dir`/epochs/
    (`checkpoints.KillSafeBackup`); an epoch trained before it was asked for
    is said in one line on stderr.

    Raises:
        RunError: bad input; nothing existing was touched.
        TrainingDiverged: the loss became NaN or Inf.
    """
    from experiments import evaluation

    use_compilation_cache()
    check_distribution(distribute, config.batch_size)
    check_keep_epochs(keep_epochs, config.epochs)
    out_dir = check_run_folder(config, out_dir)
    if export_dir is None and (out_dir / "metrics.json").exists():
        metrics = read_metrics(out_dir)
        if metrics is not None:
            say_missed_epochs(keep_epochs, config.epochs, out_dir)
            return metrics
        print(f"{out_dir / 'metrics.json'} cannot be read: measuring the run again")
    if export_dir is not None:
        # Also for a finished run: exporting it later is rerunning its command with --export.
        check_export_folder(export_dir, out_dir)
    splits = None
    if not training_finished(config, out_dir):
        # Everything that can refuse the run is checked before the folder is written.
        splits = data.load_dataset(config.dataset, limit=config.limit)
        config.check_data(splits.image_shape, len(splits.train[0]))
        source = load_checkpoint(config.init_from) if config.init_from else None
        with dtype_policy(config.precision):
            model = check_model_builds(config, splits)
            if source is not None:
                copy_shared_weights(model, source, config.init_from, partial=config.init_from_partial)
        del model
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / "config.json", config.to_dict())
        with distribution(distribute):
            _train_model(config, splits, source, out_dir, verbose, keep_epochs)
    else:
        say_missed_epochs(keep_epochs, config.epochs, out_dir)
    if not (out_dir / "throughput.json").exists():
        write_throughput(config, splits or data.load_dataset(config.dataset, limit=config.limit), out_dir)
    if export_dir is not None:
        from experiments.export import export_saved_model, write_export_record

        try:
            best = load_model_only(out_dir / "best.keras")
        except (ValueError, OSError) as error:
            raise RunError(f"cannot export {out_dir / 'best.keras'}: {first_line(error)}") from None
        export_saved_model(best, export_dir)
        # Last, so a killed export is not taken for a finished one of this run.
        write_export_record(export_dir, out_dir, config)
    return evaluation.evaluate(out_dir)


def say_missed_epochs(keep_epochs, epochs_done, out_dir):
    """One line on stderr for the epochs of `keep_epochs` that were trained without being kept."""
    missed = checkpoints.missed_epochs(keep_epochs, epochs_done, out_dir / checkpoints.KEPT_DIR)
    if missed:
        print(f"--keep-epochs: epoch {', '.join(map(str, missed))} of {out_dir} was trained before it was asked "
              f"for and cannot be kept now", file=sys.stderr)


def training_finished(config, out_dir):
    """True once every epoch is logged and the backup is gone: only evaluation is left.

    The backup is removed when fit returns, so a run killed during evaluation
    would otherwise train again from scratch. Without a backup, a history that
    does not read is a run to train from the start, as its refusal said (`_fit`).
    """
    if (out_dir / "backup").exists() or not (out_dir / "best.keras").exists():
        return False
    try:
        return len(_history_rows(out_dir)) == config.epochs
    except history.HistoryError:
        return False


@contextlib.contextmanager
def dtype_policy(precision):
    """Keras' global dtype policy set to `precision` inside the block, restored after."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


# Training steps per pass of the Keras loop, at most: the loop costs the host 5-7 ms a step,
# as long as a small ViT's step on a GPU. Every callback acts per epoch, so nothing is lost,
# and the updates are the very same (tested: identical weights to a step at a time). On
# TensorFlow the steps run in one call of the compiled function; Keras 3.15 on JAX still calls
# the compiled step once per step. A `lax.scan` over the steps, one call for all, trained
# slower on a 2-core CPU (XLA's loop body against 16 separate calls) and differed in float
# rounding, so it is not used; it is untried on a GPU.
STEPS_PER_EXECUTION = 16


def steps_per_execution(steps):
    """The largest count <= `STEPS_PER_EXECUTION` that divides the epoch's `steps`.

    A divisor, because with a shorter last dispatch in each epoch a resumed
    run stopped matching an uninterrupted one (tests/test_train.py's kill
    test, 125 steps an epoch at 16 per dispatch), although uninterrupted
    runs still matched a step at a time; with whole dispatches both match.
    """
    return max(count for count in range(1, STEPS_PER_EXECUTION + 1) if steps % count == 0)


def keras_jit_compile(choice):
    """`model.compile`'s jit_compile for a `--[no-]jit-compile` choice.

    None (not given) is XLA on TensorFlow and Keras' "auto" elsewhere (XLA on
    JAX). Keras' own "auto" turns XLA off for TensorFlow on a CPU, where it
    measured 1.33x faster for the `cpu` profile's runs
    (profiles/results/cpu-epyc-2core/tensorflow/xla_cost.json) and faster in
    the engine benchmark (profiles/results/cpu-epyc-2core/engine.json).
    """
    if choice is None:
        return True if keras.backend.backend() == "tensorflow" else "auto"
    return choice


def passes_with_xla(choice):
    """Whether a profile's own compiled passes use XLA for a `--[no-]jit-compile` choice (`keras_jit_compile`'s).

    JAX compiles every pass with XLA, so --no-jit-compile there is a
    ValueError (a usage error) rather than a setting that changes nothing.
    """
    backend = keras.backend.backend()
    if choice is False and backend != "tensorflow":
        raise ValueError(f"--no-jit-compile: {backend} compiles every pass with XLA")
    return backend != "tensorflow" or bool(keras_jit_compile(choice))


def check_model_builds(config, splits):
    """The run's model, built once before anything is written; RunError if its options cannot make one.

    Some combinations only fail when a layer sees its input shape, such as 2D
    rope on a rotated dimension (head width, or num_features rotated after
    the feature map) not divisible by 4. The layers' own checks are the
    single source of these rules, so the model is built rather than the
    rules repeated here.
    """
    try:
        return build_model(config, splits)
    except ValueError as error:
        raise RunError(f"{config.variant} cannot be built with these options: {error}") from None


def build_model(config, splits):
    """The run's model, compiled, from the run's seed: every call gives the same initial weights.

    The same builder serves train.py, the benchmark and every tuner trial;
    call it inside `dtype_policy(config.precision)`.
    """
    keras.utils.set_random_seed(config.seed)
    model = create_model(
        config.variant,
        image_shape=splits.image_shape,
        num_classes=splits.num_classes,
        mean=splits.mean,
        std=splits.std,
        **config.model_overrides(),
    )
    steps = data.steps_per_epoch(len(splits.train[0]), config.batch_size)
    loss = SmoothedSparseCrossentropy(config.label_smoothing) if config.label_smoothing else "sparse_categorical_crossentropy"
    model.compile(optimizer=build_optimizer(config, steps), loss=loss, metrics=["accuracy"],
                  steps_per_execution=steps_per_execution(steps),
                  jit_compile=keras_jit_compile(config.jit_compile))
    return model


def fit_model(model, config, splits, callbacks, initial_epoch=0, verbose=0):
    """Train `model` from `initial_epoch` to `config.epochs` on the training split, validating on the validation split.

    Epoch k's order and augmentation depend on (seed, k) alone
    (`pipelines.train_batches`), so a resumed run sees the very batches of an
    uninterrupted one. Returns Keras' `History`.
    """
    (x_train, y_train), (x_val, y_val) = splits.train, splits.validation
    steps = data.steps_per_epoch(len(x_train), config.batch_size)
    train_ds = pipelines.train_batches(
        x_train, y_train, config.batch_size, config.seed, augmentation(config, splits), initial_epoch, config.epochs
    )
    val_ds = pipelines.eval_batches(x_val, y_val, config.batch_size)
    return model.fit(
        train_ds, epochs=config.epochs, initial_epoch=initial_epoch, steps_per_epoch=steps,
        validation_data=val_ds, callbacks=callbacks, verbose=verbose,
        shuffle=False,  # the pipeline shuffles per (seed, epoch)
    )


def _train_model(config, splits, source, out_dir, verbose, keep_epochs=()):
    with dtype_policy(config.precision):
        _fit(config, splits, source, out_dir, verbose, keep_epochs)


def _fit(config, splits, source, out_dir, verbose, keep_epochs=()):
    def build():
        model = build_model(config, splits)
        if source is not None:
            write_json(out_dir / "init_from.json", copy_shared_weights(model, source, config.init_from,
                                                                       partial=config.init_from_partial))
        return model

    backup_dir = out_dir / "backup"
    model, start_epoch = checkpoints.restore(build, backup_dir, log=lambda line: print(line, file=sys.stderr))
    say_missed_epochs(keep_epochs, start_epoch, out_dir)
    try:
        if start_epoch:  # a fresh start keeps none of it
            history.read_history(out_dir / "history.csv", start_epoch)
    except history.HistoryError as error:
        raise RunError(f"{error}: mend it, or remove {backup_dir} to train the run again from the start") from None
    record_provenance(out_dir, start_epoch, model.jit_compile)  # after the checks: a damaged record refuses unwritten
    best_so_far = history.cut_history(out_dir / "history.csv", start_epoch)

    log_dir = out_dir / "logs"
    if start_epoch == 0:
        log_hparams(log_dir, config)
    callbacks = [
        EpochStats(),
        StopOnNaN(out_dir),
        checkpoints.BestCheckpoint(out_dir / "best.keras", monitor="val_accuracy", best=best_so_far),
        checkpoints.HistoryWriter(out_dir / "history.csv"),
        event_logs.EpochScalars(log_dir),
        # Last, so an epoch counts as finished only once everything above is written.
        checkpoints.KillSafeBackup(backup_dir, keep_epochs),
    ]
    fit_model(model, config, splits, callbacks, initial_epoch=start_epoch, verbose=verbose)


def augmentation(config, splits):
    """The run's training augmentation: `--augment`, else the dataset's default (`data.augmentation_for`)."""
    return config.augment or data.augmentation_for(config.dataset, splits.image_shape[-1])


def write_throughput(config, splits, out_dir):
    """throughput.json: images/s of the input pipeline alone, and of training from the history.

    Training images/s divides the images of every epoch by the sum of the
    epochs' seconds (validation included), so a run resumed across sessions,
    or killed while this file was written, gets it too.
    """
    x_train, y_train = splits.train
    steps = data.steps_per_epoch(len(x_train), config.batch_size)
    augment = augmentation(config, splits)
    seconds = sum(float(row["epoch_seconds"]) for row in _history_rows(out_dir))
    write_json(out_dir / "throughput.json", {
        "pipeline_images_per_second": pipelines.pipeline_throughput(x_train, y_train, config.batch_size, augment, seed=config.seed),
        "training_images_per_second": steps * config.batch_size * config.epochs / seconds,
    })


def _history_rows(out_dir):
    return history.read_history(out_dir / "history.csv")
