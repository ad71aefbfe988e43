"""Train one ViT variant: `python train.py` trains softmax-absolute on the bundled MNIST.

Examples:
    python train.py --variant favor-rope --dataset cifar10 --epochs 30
    python train.py --attention relu --position string --size reference --precision mixed_bfloat16
    python train.py --hparams tuning_results/mnist/favor-rope/best_hparams.json --export exported/

Bad input exits with code 2 and one line on stderr; a diverged run with code 3.
"""

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from performer_keras.cli import OneLineParser, interruptible  # noqa: E402
from performer_keras.options import non_negative_int, positive_int  # noqa: E402


def add_run_arguments(parser):
    """train.py's data, model and kernel options; also used by the tuner and the benchmark."""
    parser.add_argument("--variant", help="kernel-position, e.g. favor-rope (see --list-variants)")
    parser.add_argument("--attention", help="softmax, favor, relu, exp or linformer")
    parser.add_argument("--position", help="absolute, rope, string or kerple")
    parser.add_argument("--dataset", help="mnist or cifar10 (bundled), a .npz in the keras.datasets layout, "
                                          "or any tensorflow-datasets image dataset")
    parser.add_argument(
        "--limit", type=limit_arg,
        help="use only the first N examples of each split (smoke runs); 'all' lifts a limit set by --hparams",
    )
    parser.add_argument("--size", help="tiny, small (default) or reference (width 256, depth 6, 8 heads, MLP 512, patch 4)")
    for name in ("width", "depth", "heads", "mlp-dim", "patch-size"):
        parser.add_argument(f"--{name}", type=positive_int)
    parser.add_argument("--num-features", type=positive_int, help="random features m for favor and relu")
    parser.add_argument("--redraw-interval", type=non_negative_int, help="redraw random features every K steps (0 = never)")
    parser.add_argument("--orthogonal", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None, help="relu: phi(x) = ReLU(x)")
    parser.add_argument("--rotation-order", help="before or after the feature map")
    parser.add_argument("--rope-mixed", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--normalize-qk", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--absolute-position", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--linformer-dim", type=positive_int)
    parser.add_argument("--precision", help="float32, mixed_bfloat16 or mixed_float16")
    parser.add_argument("--augment", help="none, rotate or crop_flip (default: rotate for grayscale, crop_flip for colour)")


def limit_arg(text):
    """argparse type of --limit: an integer >= 1, or 'all' (every example)."""
    return text if text == "all" else positive_int(text)


def run_config_from_args(args, RunConfig, RunError):
    """Defaults < --hparams file < explicit flags."""
    variant = args.variant
    if args.attention or args.position:
        if variant:
            raise RunError("give either --variant or --attention/--position, not both")
        variant = f"{args.attention or 'softmax'}-{args.position or 'absolute'}"
    explicit = {name: getattr(args, name, None) for name in RunConfig.fields() if name != "variant"}
    lift_limit = explicit.get("limit") == "all"
    if lift_limit:
        explicit["limit"] = None
    config = RunConfig.from_sources(getattr(args, "hparams", None), variant=variant, **explicit)
    # from_sources reads None as "not given", so lifting a file's limit comes after it.
    return dataclasses.replace(config, limit=None) if lift_limit else config


def main(argv=None):
    parser = OneLineParser(prog="train.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    parser.add_argument("--epochs", type=positive_int)
    parser.add_argument("--batch-size", type=positive_int)
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--weight-decay", type=float)
    parser.add_argument("--seed", type=non_negative_int)
    parser.add_argument("--hparams", help="JSON of hyperparameters (e.g. the tuner's best_hparams.json)")
    parser.add_argument("--init-from", help="a .keras checkpoint (e.g. a trained softmax run's best.keras)")
    parser.add_argument("--init-from-partial", action="store_true", default=None,
                        help="start from the matching weights even if the checkpoint is of another model")
    parser.add_argument("--out", help="run folder (default runs/<variant>_<dataset>_seed<seed>)")
    parser.add_argument("--export", help="also write a SavedModel (uint8 images -> probabilities) here")
    parser.add_argument("--list-variants", action="store_true", help="print the variant names and exit")
    args = parser.parse_args(argv)
    return interruptible("train.py", lambda: run(args))


def run(args):
    from performer_keras import list_variants
    from performer_keras.data import DataError
    from performer_keras.evaluation import format_table
    from performer_keras.run_config import RunConfig, RunError
    from performer_keras.training import TrainingDiverged, train

    if args.list_variants:
        print("\n".join(list_variants(extra=True)))
        return 0
    try:
        config = run_config_from_args(args, RunConfig, RunError)
        out = args.out or os.path.join("runs", f"{config.variant}_{config.dataset}_seed{config.seed}")
        metrics = train(config, out, export_dir=args.export)
    except (RunError, DataError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    except TrainingDiverged as error:
        print(f"train.py: {error}", file=sys.stderr)
        return 3
    print(format_table(metrics))
    print(f"run folder: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
