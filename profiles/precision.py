"""Does `--precision mixed_bfloat16` train every variant as well as float32? A short run of each.

    python -m profiles.precision                       # -> profiles/results/<device>/<backend>/precision.json
    KERAS_BACKEND=jax python -m profiles.precision     # on a GPU, where bfloat16 is native
    python -m profiles.precision relu-absolute --seeds 0 1 2 3 4   # -> precision-seeds0-1-2-3-4.json

Every variant of the main table is trained twice through `training.train`
(the code behind train.py), once in float32 and once in mixed_bfloat16, with
the same seed, data, order and initial weights: `SETTINGS` (the `small` ViT,
m = 16, `EXAMPLES` MNIST training images, `EPOCHS` epochs, the full test set),
for each of `--seeds` (default: seed 0 alone). The check holds for a variant
when its bfloat16 test accuracy, averaged over the seeds, is within
`TOLERANCE` of its float32 one; the record keeps every run's accuracies, loss
curves and seconds per epoch, and the paired differences' summary (mean,
interval, p-value, smallest detectable difference; `significance.paired_test`).
With one seed a difference within the tolerance says bfloat16 costs no more
than run-to-run noise, not that it costs nothing, and one outside it cannot
be told from that noise: a few seeds can. The run folders go to a temporary
folder and are removed.
"""

import datetime
import sys
import tempfile
from pathlib import Path

from experiments.cli import Distinct, command_line, expand_variants, parser, start_backend, variant_arg

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

import keras

from experiments import atomic, history, significance, training
from experiments.run_config import RunConfig
from performer_keras.registry import list_variants
from profiles import bench
from profiles.__main__ import DEFAULT_OUT

PRECISIONS = ("float32", "mixed_bfloat16")
EXAMPLES = 5000
EPOCHS = 3
SETTINGS = dict(dataset="mnist", size="small", num_features=16, batch_size=64, limit=EXAMPLES, limit_test=False,
                epochs=EPOCHS, seed=0)
# Test accuracy points bfloat16 may lose against float32 for the check to hold.
TOLERANCE = 0.02


def short_run(variant, precision, root, settings=SETTINGS):
    """Test accuracy, loss curve and seconds per epoch of one short training run."""
    config = RunConfig(variant=variant, precision=precision, **settings)
    out_dir = Path(root) / f"{variant}-{precision}"
    try:
        metrics = training.train(config, out_dir, verbose=0)
    finally:
        # Free the run's compiled functions: without it a process of 5 seeds x 12 variants ran
        # out of memory for XLA's compiler after about 100 runs (LLVM "Cannot allocate memory").
        keras.backend.clear_session(free_memory=True)
    rows = history.read_history(out_dir / "history.csv")
    return {"test_accuracy": metrics["test_accuracy"], "loss": [float(row["loss"]) for row in rows],
            "val_accuracy": [float(row["val_accuracy"]) for row in rows],
            "seconds_per_epoch": metrics["train_seconds_per_epoch"]}


def compare(variants, settings=SETTINGS, tolerance=TOLERANCE, seeds=(0,), log=print):
    """{variant: {"runs": {seed: {precision: short_run}}, "differences", "difference", "paired", "holds"}}.

    "differences" are bf16 - float32 test accuracies, one per seed;
    "difference" is their mean, "paired" their `significance.paired_test`.
    """
    rows = {}
    with tempfile.TemporaryDirectory() as root:
        for variant in variants:
            runs, differences = {}, []
            for seed in seeds:
                seed_settings = dict(settings, seed=seed)
                pair = runs[str(seed)] = {precision: short_run(variant, precision, Path(root) / str(seed), seed_settings)
                                          for precision in PRECISIONS}
                differences.append(pair["mixed_bfloat16"]["test_accuracy"] - pair["float32"]["test_accuracy"])
                log(f"{variant} seed {seed}: float32 {pair['float32']['test_accuracy']:.4f}, "
                    f"mixed_bfloat16 {pair['mixed_bfloat16']['test_accuracy']:.4f}")
            paired = significance.paired_test(differences)
            rows[variant] = dict(runs=runs, differences=differences, difference=paired["mean"], paired=paired,
                                 holds=paired["mean"] >= -tolerance)
            log(f"{variant}: bfloat16 - float32 {100 * paired['mean']:+.2f} points over {len(seeds)} seed(s) "
                f"({'holds' if rows[variant]['holds'] else 'FAILS'})")
    return rows


def earlier_rows(path, settings):
    """The variants' rows of an earlier record at `path` made with these `settings` and `TOLERANCE`, else {}."""
    try:
        record = atomic.read_json_object(path)
    except (OSError, ValueError):
        return {}
    if record.get("settings") != settings or record.get("tolerance") != TOLERANCE:
        return {}
    return dict(record.get("variants", {}))


def record_name(seeds):
    """precision.json for the default seed 0, else the seeds in the name: precision-seeds0-1-2.json."""
    return "precision.json" if list(seeds) == [0] else f"precision-seeds{'-'.join(map(str, seeds))}.json"


def main(argv=None):
    cli = parser("python -m profiles.precision", __doc__, "out", "seeds")
    cli.add_argument("variants", type=variant_arg, nargs="*", action=Distinct, metavar="VARIANT",
                     help="registry names such as favor-rope, or all (default: the twelve of list_variants())")
    args = cli.parse_args(argv)
    seeds = sorted(set(args.seeds or [0]))
    result_dir = Path(args.out or DEFAULT_OUT) / bench.device_slug() / keras.backend.backend()
    variants = expand_variants(args.variants, list_variants())
    settings = dict(SETTINGS, seed=seeds)
    path = result_dir / record_name(seeds)
    rows = earlier_rows(path, settings)
    if rows:
        print(f"resumed: {', '.join(rows)} from {path}")
    # Written after every variant (complete: false until the last), so a run cut short keeps
    # what it measured and the same command goes on from there.
    for variant in variants:
        if variant not in rows:
            rows.update(compare([variant], seeds=seeds))
        done = {name: rows[name] for name in variants if name in rows}
        record = {
            "command": command_line("profiles.precision", argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            **bench.record_header(),
            "settings": settings, "tolerance": TOLERANCE, "complete": len(done) == len(variants),
            "holds_for_all": all(row["holds"] for row in done.values()),
            "variants": done,
        }
        atomic.write_json(path, record, indent=1, sort_keys=False)
    print(f"written: {path} (holds for all: {record['holds_for_all']})")
    return 0 if record["holds_for_all"] else 1


if __name__ == "__main__":
    sys.exit(main())
