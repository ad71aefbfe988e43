"""Evaluate a trained ViT on its test set and print the metrics table.

    python evaluate.py runs/favor-rope-mnist-42            # a run folder
    python evaluate.py model.keras --dataset mnist         # a bare model
    python evaluate.py export/ --dataset cifar10 --out eval/   # a SavedModel

Writes metrics.json and confusion_matrix.png (into the run folder, --out, or
beside the model); see `experiments.evaluation.evaluate`. The test data is the
run's own (its config.json) unless --dataset or --limit says otherwise. A run
folder's metrics.json is its result and its mark of "finished", so anything but
the run's own evaluation (other test data, a run still training, its best.keras
or export/, another run) needs --out there.
Predictions go in batches of 256 (--batch-size). Bad input (a missing path, an
unknown dataset, something that is not a model) prints one line to stderr and
exits with status 2, like an argparse usage error; running out of memory, one
line and status 4; Ctrl-C, one line and 130.
"""

import sys

from experiments.cli import fail, given_arg, interruptible, parser

PROG = "evaluate.py"


def main(argv=None):
    cli = parser(PROG, __doc__, "dataset", "limit", "batch-size", "out")
    cli.add_argument("path", type=given_arg, metavar="RUN_OR_MODEL", help="run folder, .keras file or SavedModel folder")
    args = cli.parse_args(argv)
    return interruptible(PROG, lambda: run(args), remedy="lower --batch-size")


def run(args):
    # Evaluation loads Keras and the backend, so it is imported once the command line is known to be good.
    from experiments.data import DataError
    from experiments.evaluation import evaluate
    from experiments.metrics import format_table
    from experiments.models import EvaluationError

    try:
        metrics = evaluate(args.path, args.dataset, args.limit, args.batch_size, args.out)
    except (EvaluationError, DataError) as error:
        return fail(PROG, error)
    print(format_table(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
