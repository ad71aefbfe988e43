"""How much of a trained model's FAVOR+ attention is left to its epsilon floor.

    python -m experiments.favor_floor RUN RUN/epochs/epoch0005.weights.h5 ... [--limit 256|all] [--out DIR]
        # -> DIR/favor_floor.json (DIR: the first checkpoint's run folder)

FAVOR+ features are phi(x) = m^-1/2 (exp(w^T x' - |x'|^2/2 - M) + eps), with
x' = x d^-1/4 and M, for keys, one maximum per example and head, of w^T x'
or of the whole exponent (the layer's `stabilizer`; `favor_features.positive_exp`).
A key whose exponential part lies under eps
has phi(k) = eps m^-1/2 in that feature whatever k is: its weight no longer
depends on the key, and no gradient reaches the key through it. When every
feature of every key is there, attention is a uniform average over the
tokens. This tool measures, for every FAVOR+ attention layer of each
checkpoint, on the first `--limit` test images (default `DEFAULT_EXAMPLES`):

* `floor_mass`: the share of each query's attention weight that the keys'
  floor carries, N eps m^-1/2 sum(phi(q)) / sum_j phi(q)^T phi(k_j), averaged
  over queries: 1 when the keys' features are all floor (uniform attention);
  null for kerple, whose weights carry the position too;
* `key_floor_share`, `query_floor_share`: the share of features whose
  exponential part is under eps (phi < 2 eps m^-1/2);
* `key_norm_sq`, `query_norm_sq`: |x'|^2 = |x|^2 / sqrt(d), median, 99th
  percentile and maximum (FAVOR+'s variance grows as exp(|q'|^2 + |k'|^2));
* `entropy_favor`, `entropy_softmax`: the mean entropy of the attention rows
  over log N (1: uniform), of the layer's own FAVOR+ weights and of the
  softmax of the same q and k (what FAVOR+ estimates); null for kerple and
  for rotations after the feature map, whose weights are not one product.

A checkpoint is a run folder (its best.keras), a `.keras` file, or a
`.weights.h5` of a run's `backup/` or of the `epochs/` that train.py's and
the benchmark's `--keep-epochs` keep (loaded into its run's best.keras); the
epoch and validation accuracy of each come from its run's history.csv. Each
is measured with its own stabilizer, or with `--stabilizer` for all (a model
saved before the option existed has "logits").
"""

import datetime
import json
import re
import sys
from pathlib import Path

import numpy as np

from experiments import atomic
from experiments.cli import Distinct, command_line, fail, parser, start_backend
from performer_keras.options import STABILIZERS, check_choice

FLOOR_FACTOR = 2.0  # phi < FLOOR_FACTOR eps m^-1/2: the exponential part is under eps
DEFAULT_EXAMPLES = 256


class FloorError(ValueError):
    """A checkpoint this tool cannot measure: said in one line."""


def checkpoint_files(path):
    """(model .keras, weights .weights.h5 or None, run folder or None) of a checkpoint path, or FloorError."""
    path = Path(path)
    if path.is_dir():
        if not (path / "best.keras").is_file():
            raise FloorError(f"{path} is a folder without best.keras")
        return path / "best.keras", None, path
    if not path.is_file():
        raise FloorError(f"{path} does not exist")
    if path.name.endswith(".weights.h5"):
        run = path.parent.parent
        if not (run / "best.keras").is_file():
            raise FloorError(f"{path} is not in a folder (backup/, epochs/) of a run folder with best.keras, whose "
                             f"model it needs")
        return run / "best.keras", path, run
    if path.suffix == ".keras":
        run = path.parent if (path.parent / "history.csv").is_file() else None
        return path, None, run
    raise FloorError(f"{path} is not a run folder, a .keras file or a backup .weights.h5")


def checkpoint_epoch(model_file, weights_file, run):
    """(epochs trained, validation accuracy then) of a checkpoint, from its run's history.csv; (None, None) unknown."""
    from experiments.history import HistoryError, read_history, validation_curve

    try:
        epochs, accuracy = validation_curve(read_history(run / "history.csv")) if run else ([], [])
    except HistoryError as error:
        raise FloorError(str(error)) from None
    if weights_file is not None:
        named = re.search(r"epoch(\d+)", weights_file.name)  # the backup's and --keep-epochs' names
        if named is None:
            return None, None
        done = int(named.group(1))
        return done, dict(zip(epochs, accuracy)).get(done)
    if model_file.name == "best.keras" and accuracy:
        best = max(accuracy)  # BestCheckpoint saves when val_accuracy beats every earlier epoch
        return epochs[accuracy.index(best)], best
    return None, None


def quantiles(values):
    return {"median": float(np.median(values)), "p99": float(np.percentile(values, 99)), "max": float(np.max(values))}


def row_entropy(weights):
    """Mean entropy of the rows of (.., N_q, N) attention weights, over log N."""
    weights = weights / weights.sum(-1, keepdims=True)
    entropy = -(weights * np.log(np.maximum(weights, 1e-300))).sum(-1)
    return float(entropy.mean() / np.log(weights.shape[-1]))


def layer_floor(layer, inputs):
    """The module docstring's statistics of one FAVOR+ `KernelAttention` on its (batch, N, width) inputs."""
    from keras import ops

    q, k = (np.asarray(ops.convert_to_numpy(x), "float64") for x in layer.heads(inputs)[:2])
    phi_q, phi_k = (np.asarray(ops.convert_to_numpy(x), "float64") for x in layer.features(q.astype("float32"), k.astype("float32")))
    floor_value = layer.features.epsilon * layer.features.num_features**-0.5
    floor = FLOOR_FACTOR * floor_value
    normaliser = np.einsum("bhnm,bhm->bhn", phi_q, phi_k.sum(axis=2))
    scale = layer.head_dim**-0.5
    plain = layer.position_spec.kind == "embedding" or (layer.rotates and layer.order == "before")
    biased = layer.position_spec.kind == "bias"  # kerple weighs every pair by its position too
    if plain:
        logits = np.einsum("bhnd,bhjd->bhnj", q, k) * scale
        softmax = np.exp(logits - logits.max(-1, keepdims=True))
    return {
        "layer": layer.name,
        "floor_mass": None if biased else float(np.mean(phi_k.shape[2] * floor_value * phi_q.sum(-1) / normaliser)),
        "key_floor_share": float(np.mean(phi_k < floor)),
        "query_floor_share": float(np.mean(phi_q < floor)),
        "key_norm_sq": quantiles((k**2).sum(-1) * scale),
        "query_norm_sq": quantiles((q**2).sum(-1) * scale),
        "entropy_favor": row_entropy(np.einsum("bhnm,bhjm->bhnj", phi_q, phi_k)) if plain else None,
        "entropy_softmax": row_entropy(softmax) if plain else None,
    }


def largest_floor_mass(run):
    """{"floor_mass", "layer", "epoch"}: the largest share of one layer's attention on the floor over every checkpoint
    that the run folder's favor_floor.json read; None where the run has no such file or no layer with a floor mass
    (kerple), and FloorError for a file this tool did not write (a report should not pass over it in silence)."""
    path = Path(run) / "favor_floor.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        rows = [(layer["floor_mass"], layer["layer"], checkpoint["epoch"]) for checkpoint in record["checkpoints"]
                for layer in checkpoint["layers"] if layer["floor_mass"] is not None]
    except (ValueError, KeyError, TypeError) as error:
        raise FloorError(f"{path} is damaged or not written by experiments.favor_floor ({error!r})") from None
    if not rows:
        return None
    mass, layer, epoch = max(rows, key=lambda row: row[0])
    return {"floor_mass": mass, "layer": layer, "epoch": epoch}


def measure(path, found, examples, dataset=None, stabilizer=None):
    """{"checkpoint", "epoch", "val_accuracy", "dataset", "stabilizer", "layers": [layer_floor per FAVOR+ layer]};
    FloorError if none. `found` is (model_file, weights_file, run, epoch, accuracy): checkpoint_files(path) and
    checkpoint_epoch of them, which main reads before anything is measured. `stabilizer` replaces the model's own
    (None: keep it)."""
    import keras

    from experiments.data import load_dataset
    from experiments.models import first_line, load_model_only
    from performer_keras.favor_features import FavorFeatures
    from performer_keras.kernel_attention import KernelAttention

    model_file, weights_file, run, epoch, accuracy = found
    if dataset is None:
        config = run / "config.json" if run else None
        if not (config and config.is_file()):
            raise FloorError(f"{path}: no run config.json to take the dataset from; give --dataset")
        try:
            dataset = atomic.read_json_object(config).get("dataset")
        except ValueError as error:
            raise FloorError(str(error)) from None
        if not isinstance(dataset, str):
            raise FloorError(f"{config} names no dataset; give --dataset")
    try:
        model = load_model_only(model_file)
        if weights_file is not None:
            model.load_weights(weights_file)
    except (ValueError, OSError) as error:  # damaged, another format, or weights of another model
        raise FloorError(f"{weights_file or model_file} does not load: {first_line(error)}") from None
    layers = [layer for layer in model.layers
              if isinstance(layer, KernelAttention) and isinstance(getattr(layer, "features", None), FavorFeatures)]
    if not layers:
        raise FloorError(f"{model_file} has no FAVOR+ attention layer")
    if stabilizer is not None:  # read at every call, so a trained model can be measured under the other one
        for layer in layers:
            layer.stabilizer = layer.features.stabilizer = stabilizer
    images = load_dataset(dataset, examples).test[0]
    if tuple(model.inputs[0].shape[1:]) != images.shape[1:]:  # a model of another dataset, named by --dataset
        raise FloorError(f"{model_file} takes inputs of shape {tuple(model.inputs[0].shape[1:])}, but {dataset}'s "
                         f"images have {images.shape[1:]}")
    inputs = keras.Model(model.inputs, [layer.input for layer in layers]).predict(images, verbose=0, batch_size=128)
    inputs = inputs if len(layers) > 1 else [inputs]  # predict unwraps a one-output list
    return {"checkpoint": str(path), "epoch": epoch, "val_accuracy": accuracy, "dataset": dataset,
            "examples": len(images), "stabilizer": layers[0].features.stabilizer,
            "layers": [layer_floor(layer, x) for layer, x in zip(layers, inputs)]}


def main(argv=None):
    prog = "python -m experiments.favor_floor"
    cli = parser(prog, __doc__, "dataset", "limit", "stabilizer", "out")
    cli.add_argument("checkpoints", nargs="+", action=Distinct, metavar="CHECKPOINT")
    args = cli.parse_args(argv)
    examples = DEFAULT_EXAMPLES if args.limit is None else None if args.limit == "all" else args.limit
    try:
        if args.stabilizer is not None:
            check_choice("stabilizer", args.stabilizer, STABILIZERS)
        # the histories are read here, so that a damaged history.csv is refused before the measurement, not after it
        found = [(*files, *checkpoint_epoch(*files)) for files in map(checkpoint_files, args.checkpoints)]
        first_run = found[0][2]
    except ValueError as error:  # FloorError, or check_choice's
        return fail(prog, error)
    out = Path(args.out) if args.out else first_run
    if out is None:
        return fail(prog, f"{args.checkpoints[0]} is not in a run folder; give --out")
    start_backend(prog)
    from experiments.data import DataError

    try:
        measured = [measure(path, checkpoint, examples, args.dataset, args.stabilizer)
                    for path, checkpoint in zip(args.checkpoints, found)]
    except (FloorError, DataError) as error:
        return fail(prog, error)
    record = {
        "command": command_line("experiments.favor_floor", argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "floor": f"phi < {FLOOR_FACTOR} eps m^-1/2",
        "checkpoints": measured,
    }
    atomic.write_json(out / "favor_floor.json", record, indent=1, sort_keys=False)
    for item in measured:
        print(f"{item['checkpoint']} (epoch {item['epoch']}, validation {item['val_accuracy']}, "
              f"stabilizer {item['stabilizer']})")
        for row in item["layers"]:
            mass = "" if row["floor_mass"] is None else f"floor's share of the attention {row['floor_mass']:.3f}; "
            entropy = "" if row["entropy_favor"] is None else \
                f"; entropy/log N {row['entropy_favor']:.3f} (softmax of the same q, k {row['entropy_softmax']:.3f})"
            print(f"  {row['layer']}: {mass}features under the floor: keys {row['key_floor_share']:.3f}, queries "
                  f"{row['query_floor_share']:.3f}; |k'|^2 median {row['key_norm_sq']['median']:.1f}, "
                  f"p99 {row['key_norm_sq']['p99']:.1f}{entropy}")
    print(f"written: {out / 'favor_floor.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
