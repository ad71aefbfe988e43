"""Every command-line option of every tool, defined once, and how the tools fail.

`train.py`, `evaluate.py`, `python -m tuning`, `python -m tuning.sweep`, the
benchmark, the report, the pilots and `python -m profiles` build their parsers
with `parser(prog, doc, *names)` from `OPTIONS` below: one name, type, default,
help and check per option, so `--seeds` or `--batch-size` mean the same thing
in every tool. A default of None means "the tool's own": the run config's
(`experiments.run_config.RunConfig`), the profile's, or the bench's, each named
in the tool's --help text.

The promise of every tool (README, "What a kill costs"): bad input exits 2
with exactly one line on stderr, and Ctrl-C exits 130 with one line. This
module imports neither Keras nor TensorFlow, so a bad argument is refused
before a backend starts, and it silences TensorFlow's start-up log for the
tool that imports it.
"""

import argparse
import importlib
import logging
import math
import os
import re
import shlex
import sys
import tempfile

from experiments import huge_pages
from performer_keras.options import MAX_SEED
from performer_keras.registry import list_variants

# Must be set before TensorFlow is first imported: its C++ start-up log is
# several lines on stderr, and the one-line promise above covers them.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# What that level does not reach: absl prints the lines logged before its
# InitializeLog() whatever the level (TF 2.21 on Intel CPUs: "oneDNN custom
# operations are on", twice, each after absl's own warning that it does so).
ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
ABSL_INFO_OR_WARNING = re.compile(r"^[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] ")

# The Keras backends the project runs on (`compiled`, `profiles.engine`, --backends).
BACKENDS = ("tensorflow", "jax")

USAGE_ERROR = 2
OUT_OF_MEMORY = 4
INTERRUPTED = 130
# The part of a TensorFlow out-of-memory error worth a line: "OOM when allocating tensor with
# shape[...] and type float", without the op's device path and the graph's stack that follow.
TF_OOM = re.compile(r"OOM when allocating tensor with shape\[[^\]]*\] and type \w+")


def positive_int(text):
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text):
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def seed_arg(text):
    """argparse type of a seed: an integer from 0 to MAX_SEED."""
    value = non_negative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {MAX_SEED}, got {text!r}")
    return value


def _int_at_least(text, low):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}")
    return value


def positive_float(text):
    """argparse type: a finite number > 0."""
    return _finite(text, lambda value: value > 0, "a finite number > 0")


def finite_float(text):
    """argparse type: a finite number (the run config checks its range)."""
    return _finite(text, lambda value: True, "a finite number")


def _finite(text, valid, said):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and valid(value)):
        raise argparse.ArgumentTypeError(f"expected {said}, got {text!r}")
    return value


def shard_arg(text):
    """argparse type: "K/N" with 0 <= K < N, one of N workers."""
    index, _, count = text.partition("/")
    try:
        index, count = int(index), int(count)
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"expected K/N with 0 <= K < N, got {text!r}")
    return index, count


def given_arg(text):
    """argparse type of a name or path: any text but an empty one, which an unset shell variable gives
    (`--out "$DIR"`) and which would otherwise mean the current folder or the tool's default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a name or path, got an empty string")
    return text


def folder_arg(text):
    """argparse type of a folder to write into: any path but an empty one, an existing file, or one that
    cannot be made (under a file, or where no folder can be made): checked now, since the tools
    first write there after their work (a profile) or after building the model."""
    given_arg(text)
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder")
    existing = os.path.abspath(text)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(f"{text} lies under {existing}, a file; give a folder")
    _check_writable(text, existing, "folder")
    return text


def _check_writable(text, folder, what):
    """ArgumentTypeError unless a `what` ("folder" or "file") can be made in the existing `folder`."""
    # One made and removed is the only answer that holds everywhere: as root access() grants every
    # write, yet a read-only mount or a kernel file system such as /proc still refuses one.
    try:
        if what == "folder":
            os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".write-check-"))
        else:
            handle, path = tempfile.mkstemp(dir=folder, prefix=".write-check-")
            os.close(handle)
            os.remove(path)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"{text} cannot be written: no {what} can be made in {folder} "
                                         f"({error.strerror})") from None


def archive_arg(text):
    """argparse type of --archive: a .tar.gz file name in an existing folder that can be written, checked
    now since the archive is written once the queue ends, hours later."""
    given_arg(text)
    if not text.endswith(".tar.gz") or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a file name ending in .tar.gz, got {text!r}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text}: its folder does not exist")
    _check_writable(text, folder, "file")
    return text


def checkout_arg(text):
    """argparse type of --baseline: a checkout of this project (its `experiments` package), checked now since
    the engine benchmark measures the baseline after minutes of timing this checkout."""
    given_arg(text)
    if not os.path.isfile(os.path.join(text, "experiments", "__init__.py")):
        raise argparse.ArgumentTypeError(f"{text} is not a checkout of this project (no experiments/__init__.py); "
                                         "make one with git worktree add PATH COMMIT")
    return text


def variant_arg(text):
    """argparse type of a --variants entry: a variant of the registry (train.py --list-variants) or 'all',
    checked now since the profiles and the benchmark meet a bad name only after minutes of work."""
    if text != "all" and text not in list_variants(extra=True):
        raise argparse.ArgumentTypeError(f"unknown variant {text!r}; expected 'all' or one of {list_variants(extra=True)}")
    return text


def expand_variants(names, default=None):
    """The variants `--variants` names, 'all' standing for the twelve of the comparison and repeats
    dropped, in order; `default` when none is named."""
    if not names:
        return default
    return list(dict.fromkeys(variant for name in names for variant in (list_variants() if name == "all" else [name])))


def limit_arg(text):
    """argparse type of --limit: an integer >= 1, or 'all' (every example, lifting a limit set elsewhere)."""
    return text if text == "all" else positive_int(text)


class Distinct(argparse.Action):
    """Store a list option's values with repeats dropped, in order: a seed, dataset, epoch or token count
    named twice would train, keep or measure the same thing twice (and write one result over the other)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(dict.fromkeys(values)))


_FLAG = dict(action="store_true")
_SWITCH = dict(action=argparse.BooleanOptionalAction, default=None)
_LIST = dict(nargs="+", action=Distinct)

# Option name (without "--") -> argparse keywords. Keep one line per option.
OPTIONS = {
    # What to train.
    "variant": dict(help="kernel-position, e.g. favor-rope (see train.py --list-variants)"),
    "attention": dict(help="softmax, favor, relu, exp or linformer (with --position, instead of --variant)"),
    "position": dict(help="absolute, rope, string or kerple (with --attention, instead of --variant)"),
    "variants": dict(type=variant_arg, **_LIST, metavar="VARIANT", help="variant names; 'all': the twelve of the comparison"),
    "dataset": dict(type=given_arg, help="mnist or cifar10 (bundled), a .npz in the keras.datasets layout, a folder of images with one subfolder per class, or a tensorflow-datasets name"),
    "datasets": dict(type=given_arg, **_LIST, metavar="DATASET", help="dataset names (default: the profile's)"),
    "limit": dict(type=limit_arg, help="only the first N examples of each split; 'all' lifts a limit set elsewhere"),
    "augment": dict(help="none, rotate, rotate_shift (rotate, then move up to 3 pixels) or crop_flip (default: rotate for grayscale, crop_flip for colour)"),
    # The model.
    "size": dict(help="tiny, small or reference (performer_keras.registry.SIZES)"),
    "width": dict(type=positive_int, help="token width (default: the size's)"),
    "depth": dict(type=positive_int, help="transformer blocks (default: the size's)"),
    "heads": dict(type=positive_int, help="attention heads (default: the size's)"),
    "mlp-dim": dict(type=positive_int, help="hidden units of each block's MLP (default: the size's)"),
    "patch-size": dict(type=positive_int, help="patch side in pixels (default: the size's)"),
    "num-features": dict(type=positive_int, help="random features m of favor and relu"),
    "redraw-interval": dict(type=non_negative_int, help="redraw random features every K steps (0 = never)"),
    "orthogonal": dict(**_SWITCH, help="orthogonal random projections"),
    "deterministic": dict(**_SWITCH, help="relu: phi(x) = ReLU(x), no projection"),
    "rotation-order": dict(help="rotate q and k before or after the feature map"),
    "rope-mixed": dict(**_SWITCH, help="learned RoPE frequencies mixing rows and columns"),
    "normalize-qk": dict(**_SWITCH, help="l2-normalise q and k (default: on for kerple only)"),
    "learn-qk-norm": dict(**_SWITCH, help="with --normalize-qk, learn each head's norm starting at --qk-norm (default on)"),
    "qk-norm": dict(type=positive_float, help="with --normalize-qk, the norm of q and k in units of sqrt(d) (default 0.25; Luo et al.'s is 1)"),
    "absolute-position": dict(**_SWITCH, help="add the learned absolute embedding"),
    "linformer-dim": dict(type=positive_int, help="projected length k of linformer"),
    "stabilizer": dict(help="favor: what the features' stabiliser is the maximum of, exponent (default: keeps long keys "
                            "from pushing the others under the epsilon floor) or logits (the Performer's, the profiles')"),
    "precision": dict(help="float32, mixed_bfloat16 or mixed_float16"),
    "jit-compile": dict(**_SWITCH, help="compile the training step with XLA (default: on; --no-jit-compile turns it off on TensorFlow)"),
    # How to train.
    "epochs": dict(type=positive_int, help="training epochs (default: the run config's or the profile's)"),
    "batch-size": dict(type=positive_int, help="examples per step (default: the tool's, see its description)"),
    "learning-rate": dict(type=finite_float, help="peak AdamW learning rate"),
    "weight-decay": dict(type=finite_float, help="AdamW weight decay"),
    "dropout": dict(type=finite_float, help="dropout rate of the embedding and of each block's attention and MLP "
                                            "(default 0: no dropout layer)"),
    "label-smoothing": dict(type=finite_float, help="label smoothing of the cross-entropy, in [0, 1) (default 0)"),
    "seed": dict(type=seed_arg, help="seed of the data order, initialisation and features"),
    "seeds": dict(type=seed_arg, **_LIST, metavar="SEED", help="the seeds to run (default: the tool's)"),
    "hparams": dict(type=given_arg, help="JSON of hyperparameters (e.g. the tuner's best_hparams.json); explicit flags win"),
    "init-from": dict(type=given_arg, help="a .keras checkpoint or a run folder (its best.keras) to copy matching weights from"),
    "init-from-partial": dict(action="store_true", default=None,
                              help="start from the matching weights even if the checkpoint is of another model"),
    # Where results go.
    "distribute": dict(default="none", choices=["none", "data"],
                       help="data: split each batch over every local device (JAX, Keras' DataParallel)"),
    "out": dict(type=folder_arg, help="output folder (default: see the tool's description)"),
    "export": dict(type=folder_arg, help="also write a SavedModel (uint8 images -> probabilities) here"),
    "keep-epochs": dict(type=positive_int, **_LIST, default=(), metavar="EPOCH",
                        help="also keep the weights after these epochs in the run folder's epochs/, which outlives "
                             "the backup (for python -m experiments.favor_floor)"),
    "results-dir": dict(type=folder_arg, default="results", help="parent of results/<profile>/ (default results)"),
    # The tuner.
    "algorithm": dict(default="hyperband", help="hyperband (default), bayesian or random"),
    "max-trials": dict(type=positive_int, help="bayesian and random: at most N trials (default 20); Hyperband runs one iteration of its brackets"),
    "space": dict(action="append", default=[], metavar="NAME=VALUES",
                  help="narrow or widen a space: learning_rate=1e-4:1e-3 (log-uniform), "
                       "num_features=32,64 (choice), redraw_interval=0 (fixed); repeatable"),
    "space-file": dict(type=given_arg, help="JSON {name: 'low:high' | [values] | value}; --space wins"),
    "show-space": dict(**_FLAG, help="print the search space and exit"),
    "quiet": dict(**_FLAG, help="no per-trial output"),
    # The benchmark.
    "profile": dict(default="small", help="a profile of experiments/benchmark_profiles.py (default small)"),
    "experiments": dict(**_LIST, help="some of variants, init_from, num_features, normalize_qk, learning_rate, "
                                        "stabilizer (default: all)"),
    "max-runs": dict(type=non_negative_int, help="stop after training this many runs (with --workers, in all)"),
    "max-minutes": dict(type=positive_float, help="start no run that the time left cannot finish, judged by the "
                                                   "finished runs' epoch times, then stop cleanly"),
    "workers": dict(type=positive_int, default=1,
                    help="train this many queued runs at once, each in its own process with its share of the "
                         "accelerator's memory (default 1; keep 1 on a CPU)"),
    "shard": dict(type=shard_arg, help="K/N: run only queue entries K, K+N, K+2N, ... (what --workers gives each "
                                        "worker process)"),
    "archive": dict(type=archive_arg, help="at the end, pack every finished run folder (no backups, no checkpoints) into this .tar.gz"),
    "list": dict(**_FLAG, help="print the queue with each run's state and the time each queued run needs on this "
                               "machine (from other devices' runs where it has run none like it), and exit"),
    "list-variants": dict(**_FLAG, help="print the variant names and exit"),
    "verbose": dict(**_FLAG, help="Keras progress lines for every epoch"),
    # Cost profiles.
    "baseline": dict(type=checkout_arg, help="a checkout of another commit whose train.py path to measure alongside this one"),
    "backends": dict(**_LIST, choices=BACKENDS, help="the backends to measure (default: both)"),
    "compare-huge-pages": dict(action="store_true",
                               help="also time every subject with and without huge pages for XLA's buffers"),
    "roofline": dict(action="store_true",
                     help="also time float matmuls (large square ones and the ViT's own shapes) and read each "
                          "subject's FLOPs per second against them"),
    "rounds": dict(type=positive_int, help="timed rounds after the warm-up one (default: the profile's)"),
    "worker-counts": dict(type=positive_int, **_LIST, metavar="N",
                          help="also time train.py's path in N processes at once on one accelerator, for each N"),
    "burn-in": dict(type=non_negative_int, default=1, help="untimed steps after the compiling one (default 1)"),
    "steps": dict(type=positive_int, default=3, help="timed training steps (default 3)"),
    "trace-steps": dict(type=non_negative_int, default=2, help="training steps traced by the profiler (0: none)"),
    "tokens": dict(type=positive_int, **_LIST, metavar="N",
                   help="patches of the scaling grids (the CLS token adds one; default 64 .. 16384)"),
    "model-tokens": dict(type=positive_int, **_LIST, metavar="N", help="patches for the model scope (default: --tokens)"),
    "scopes": dict(**_LIST, help="scaling scopes: layer, model (default both)"),
    "shapes": dict(**_LIST, help="kerple_paths' layer shapes: cpu, reference (default both)"),
    "fit-only": dict(**_FLAG, help="time nothing: print each backend's FFT and DFT factors fitted to every "
                                   "kerple_paths.json under --out (default profiles/results)"),
    "remodel": dict(**_FLAG, help="time nothing: recompute the cost-model fields of every kerple_paths.json under "
                                  "--out (default profiles/results) from its timings, after a change of the model"),
    "subjects": dict(**_LIST, help="kerple_paths' subjects: dense, fft, dft, softmax (default all; fewer for grids "
                                   "where some cannot run)"),
    "fused-softmax": dict(**_FLAG, help="also sweep softmax through ops.dot_product_attention (flash where available)"),
    "scaling-steps": dict(type=positive_int, default=3, help="timed calls per scaling point (default 3)"),
    "max-seconds": dict(type=positive_float, default=20.0,
                        help="stop timing a scaling point after this many seconds of calls (default 20)"),
    "time-limit": dict(type=positive_float, default=180.0, help="seconds per scaling point (default 180)"),
    "bench-time-limit": dict(type=positive_float, default=900.0, help="seconds per stage of a variant's bench (default 900)"),
    "memory-limit-gb": dict(type=positive_float, default=8.0,
                            help="resident memory of a measurement before it counts as out of memory (default 8)"),
    "skip-bench": dict(**_FLAG, help="no per-variant bench"),
    "skip-scaling": dict(**_FLAG, help="no scaling sweep"),
    "resume": dict(**_FLAG, help="keep results whose JSON file already exists"),
    "in-process": dict(**_FLAG, help="measure in this process: faster, but no limits and no recovery from a crash"),
    "report-only": dict(**_FLAG, help="only rewrite summary.md and the plots"),
}

# The options of one training run: train.py's, and the base run of every tuner trial.
VARIANT_OPTIONS = ("variant", "attention", "position")
RUN_OPTIONS = (
    *VARIANT_OPTIONS, "dataset", "limit", "size", "width", "depth", "heads", "mlp-dim",
    "patch-size", "num-features", "redraw-interval", "orthogonal", "deterministic", "rotation-order",
    "rope-mixed", "normalize-qk", "qk-norm", "learn-qk-norm", "absolute-position", "linformer-dim", "stabilizer", "precision",
    "jit-compile",
    "augment", "dropout", "label-smoothing", "epochs", "batch-size", "seed",
)
# The benchmark's queue selection, shared with its report.
SELECTION_OPTIONS = ("profile", "variants", "datasets", "seeds", "epochs", "experiments", "results-dir")


class UsageError(ValueError):
    """A bad command line found after parsing (two options that exclude each other, say)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not the whole usage block: "prog: error: ... (see --help)"."""

    def error(self, message):
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see --help)\n")


def parser(prog, doc, *names):
    """A `OneLineParser` for `prog` whose description is `doc`, with the options `names` of `OPTIONS`."""
    built = OneLineParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(built, *names)
    return built


def add_options(parser, *names):
    """Add the options `names` (keys of `OPTIONS`) to `parser`, in that order."""
    for name in names:
        parser.add_argument(f"--{name}", **OPTIONS[name])


def fail(prog, message, status=USAGE_ERROR):
    """Print "prog: error: message" as one line on stderr and return `status`."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return status


def command_line(module, argv):
    """The shell command that reruns `python -m module` with `argv` (None: the process's own) on this backend.

    TensorFlow is Keras' default backend; any other is named, so that a
    record made on JAX says how to make it again.
    """
    import keras

    backend = keras.backend.backend()
    prefix = "" if backend == "tensorflow" else f"KERAS_BACKEND={backend} "
    return f"{prefix}python -m {module} {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip()


def start_backend(prog=None):
    """Import Keras, and with it the backend, dropping TensorFlow's start-up log from stderr and keeping the rest.

    A KERAS_BACKEND that the project does not run on (`BACKENDS`) exits here
    with status 2 and one line, "prog: error: ..." (`prog` defaults to the
    script's name), where Keras' import would end in a traceback (torch, not
    installed) or fail later in the first compiled step (numpy).

    stderr's file descriptor is captured during the import, because the log
    comes from C++, and the captured lines are written back except absl's
    info and warning lines (what TF_CPP_MIN_LOG_LEVEL=2 would drop) and its
    preamble: errors and Python's own warnings still show. On TensorFlow,
    its retracing warning about Keras' step functions is dropped too
    (`_OneTracePerModel`). First, one of the project's commands restarts
    itself with huge pages for XLA's buffers where they help
    (`experiments.huge_pages`).
    """
    requested = os.environ.get("KERAS_BACKEND")
    if requested is not None and requested not in BACKENDS:
        raise SystemExit(fail(prog or os.path.basename(sys.argv[0]),
                              f"KERAS_BACKEND={requested!r} is not one of {BACKENDS} (unset, it is tensorflow)"))
    huge_pages.restart_if_useful()
    if "keras" not in sys.modules:
        import_quietly("keras")
    import keras

    if keras.backend.backend() == "jax":
        keep_keras_from_importing_tensorflow()
    else:
        logging.getLogger("tensorflow").addFilter(ONE_TRACE_PER_MODEL)


class _OneTracePerModel(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning about Keras' own step functions.

    TensorFlow counts a function's traces by its Python code object, so the
    step function of every model that one process builds (a search's trials
    and confirmation seeds, a benchmark's runs, a report's models) counts as
    a retrace of the first one's: from the fifth model on it warned, in a
    paragraph, that tracing is expensive, though each new model must trace
    its own step. Warnings about any other function still show.
    """

    def filter(self, record):
        message = record.getMessage()
        return not ("triggered tf.function retracing" in message and "TensorFlowTrainer." in message)


ONE_TRACE_PER_MODEL = _OneTracePerModel()


def keep_keras_from_importing_tensorflow():
    """Stop Keras importing TensorFlow under JAX just because it is installed.

    Keras 3 imports TensorFlow wherever it can: `keras.utils.set_random_seed`
    to seed tf.random, and every `model.save` to check for TensorShapes. Under
    JAX that costs each process seconds and hundreds of MB, and on a GPU
    machine loads TensorFlow's CUDA libraries beside JAX's (issue 14: no
    TensorFlow under JAX). Both ask Keras' lazy handle `available` first, so
    marking it unavailable turns them off. What really needs TensorFlow
    (SavedModel export, tensorflow-datasets, saliency maps) imports it itself
    and still works. The handle is private: keras is pinned in
    requirements.txt, and tests/test_no_tensorflow.py checks that a JAX run
    with TensorFlow installed never imports it.
    """
    from keras.src.utils import module_utils

    if "tensorflow" not in sys.modules:
        module_utils.tensorflow._available = False


def import_quietly(name):
    """Import the module `name` with TensorFlow's start-up log dropped from stderr (see `start_backend`).

    Under JAX, TensorFlow is imported only where a feature needs it (a
    SavedModel, tensorflow-datasets), after the backend started: that import
    goes through here so its log does not break the one-line promise.
    """
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            return importlib.import_module(name)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not is_start_up_log(line):
                    sys.stderr.write(line)


def is_start_up_log(line):
    """Whether `line` is absl's preamble or one of its info or warning lines (see `start_backend`)."""
    return line.strip() == ABSL_PREAMBLE or bool(ABSL_INFO_OR_WARNING.match(line))


# The out-of-memory line's advice for the commands that train or measure a model (`interruptible`); a
# run folder refuses another configuration, hence the new --out.
TRAINING_REMEDY = "lower --batch-size, --num-features or the model's size (in another --out for a run folder)"


def out_of_memory(error):
    """What ran out, in a few words, when `error` is the backend (or numpy) out of memory; else None.

    TensorFlow raises ResourceExhaustedError, JAX a JaxRuntimeError (in older
    jaxlib, XlaRuntimeError) whose status is RESOURCE_EXHAUSTED; both are told
    by name and text, so that neither backend is imported to catch them.
    """
    if isinstance(error, MemoryError):
        return f"numpy: {error}" if str(error) else "numpy"
    text = str(error)
    if type(error).__name__ == "ResourceExhaustedError":
        found = TF_OOM.search(text)
        return found.group(0) if found else text.strip().splitlines()[0][:200]
    if type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and text.startswith("RESOURCE_EXHAUSTED"):
        return text.splitlines()[0][:200]
    return None


def interruptible(prog, function, remedy=TRAINING_REMEDY):
    """`function()`'s exit status; Ctrl-C gives one line and 130, running out of memory one line and 4, not a traceback.

    Whatever was finished is already on disk (every write is atomic), so the
    same command resumes. The backend starts here (`start_backend`), once
    the command line is known to be good. `remedy` ends the out-of-memory
    line: what lowers this command's memory, in its own options.
    """
    try:
        start_backend(prog)
        return function()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; run the same command again to resume", file=sys.stderr)
        return INTERRUPTED
    except Exception as error:
        what = out_of_memory(error)
        if what is None:
            raise
        return fail(prog, f"out of memory ({what}); what was finished is kept: {remedy}", OUT_OF_MEMORY)
