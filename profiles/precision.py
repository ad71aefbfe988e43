"""Does `--precision mixed_bfloat16` train every variant as well as float32? A short run of each.

    python -m profiles.precision                       # -> profiles/results/<device>/<backend>/precision.json
    KERAS_BACKEND=jax python -m profiles.precision     # on a GPU, where bfloat16 is native

Every variant of the main table is trained twice through `training.train`
(the code behind train.py), once in float32 and once in mixed_bfloat16, with
the same seed, data, order and initial weights: `SETTINGS` (the `small` ViT,
m = 16, `EXAMPLES` MNIST training images, `EPOCHS` epochs, the full test set).
The check holds for a variant when its bfloat16 test accuracy is within
`TOLERANCE` of its float32 one; the record keeps both, the loss curves and
seconds per epoch. One seed: a difference within the tolerance says bfloat16
costs no more than run-to-run noise, not that it costs nothing. The run
folders go to a temporary folder and are removed.
"""

import datetime
import sys
import tempfile
from pathlib import Path

from experiments.cli import parser, start_backend

start_backend()  # before the imports below load Keras: why, in the docstring of profiles/__init__.py

import keras

from experiments import atomic, history, training
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
    metrics = training.train(config, out_dir, verbose=0)
    rows = history.read_history(out_dir / "history.csv")
    return {"test_accuracy": metrics["test_accuracy"], "loss": [float(row["loss"]) for row in rows],
            "val_accuracy": [float(row["val_accuracy"]) for row in rows],
            "seconds_per_epoch": metrics["train_seconds_per_epoch"]}


def compare(variants, settings=SETTINGS, tolerance=TOLERANCE, log=print):
    """{variant: {precision: short_run, "difference": bf16 - float32 test accuracy, "holds"}}."""
    rows = {}
    with tempfile.TemporaryDirectory() as root:
        for variant in variants:
            row = {precision: short_run(variant, precision, root, settings) for precision in PRECISIONS}
            difference = row["mixed_bfloat16"]["test_accuracy"] - row["float32"]["test_accuracy"]
            rows[variant] = dict(row, difference=difference, holds=difference >= -tolerance)
            log(f"{variant}: float32 {row['float32']['test_accuracy']:.4f}, "
                f"mixed_bfloat16 {row['mixed_bfloat16']['test_accuracy']:.4f} ({'holds' if rows[variant]['holds'] else 'FAILS'})")
    return rows


def main(argv=None):
    cli = parser("python -m profiles.precision", __doc__, "out")
    cli.add_argument("variants", nargs="*", metavar="VARIANT", help="default: the twelve of list_variants()")
    args = cli.parse_args(argv)
    result_dir = Path(args.out or DEFAULT_OUT) / bench.device_slug() / keras.backend.backend()
    variants = args.variants or list_variants()
    rows = compare(variants)
    record = {
        "command": bench.command_line("profiles.precision", argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        **bench.record_header(),
        "settings": SETTINGS, "tolerance": TOLERANCE,
        "holds_for_all": all(row["holds"] for row in rows.values()),
        "variants": rows,
    }
    atomic.write_json(result_dir / "precision.json", record, indent=1, sort_keys=False)
    print(f"written: {result_dir / 'precision.json'} (holds for all: {record['holds_for_all']})")
    return 0 if record["holds_for_all"] else 1


if __name__ == "__main__":
    sys.exit(main())
