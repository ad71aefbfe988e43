"""Evaluate a trained ViT on its test set and print the metrics table.

    python evaluate.py runs/favor-rope-mnist-42            # a run folder
    python evaluate.py model.keras --dataset mnist         # a bare model
    python evaluate.py export/ --dataset cifar10 --out eval/   # a SavedModel

Writes metrics.json and confusion_matrix.png (into the run folder, --out, or
beside the model); see `performer_keras.evaluation.evaluate`. Bad input (a
missing path, an unknown dataset, something that is not a model) prints one
line to stderr and exits with status 2, like an argparse usage error.
"""

import sys


def parse_args(argv=None):
    from performer_keras.cli import OneLineParser
    from performer_keras.options import positive_int

    parser = OneLineParser(prog="evaluate.py", description=__doc__.splitlines()[0])
    parser.add_argument("path", metavar="RUN_OR_MODEL", help="run folder, .keras file or SavedModel folder")
    parser.add_argument("--dataset", help="test data (default: the run's config.json)")
    parser.add_argument("--limit", type=positive_int, help="first N test examples (default: the run's)")
    parser.add_argument("--batch-size", type=positive_int, default=256, help="prediction batch (default 256)")
    parser.add_argument("--out", help="folder for metrics.json and confusion_matrix.png (required to evaluate a "
                        "finished run on other test data than its own)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from performer_keras.data import DataError
    from performer_keras.evaluation import EvaluationError, evaluate, format_table

    try:
        metrics = evaluate(args.path, args.dataset, args.limit, args.batch_size, args.out)
    except (EvaluationError, DataError) as err:
        print(f"evaluate.py: error: {err}", file=sys.stderr)
        return 2
    print(format_table(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
