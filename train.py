"""Train one ViT variant: `python train.py` trains softmax-absolute on the bundled MNIST.

Examples:
    python train.py --variant favor-rope --dataset cifar10 --epochs 30
    python train.py --attention relu --position string --size reference --precision mixed_bfloat16
    python train.py --hparams tuning_results/mnist/favor-rope/best_hparams.json --export exported/

Defaults are those of `experiments.run_config.RunConfig` (softmax-absolute,
size small, 10 epochs, batch 128); the run folder is --out, by default
runs/<variant>_<dataset>_seed<seed>/. Bad input exits with code 2 and one line on stderr; a diverged run with code 3;
running out of memory with code 4 and one line.
"""

import os
import sys

from experiments.cli import RUN_OPTIONS, fail, interruptible, parser
from experiments.run_config import RunConfig, RunError
from performer_keras.registry import list_variants


def main(argv=None):
    cli = parser("train.py", __doc__, *RUN_OPTIONS, "learning-rate", "weight-decay", "hparams", "init-from",
                 "init-from-partial", "distribute", "out", "export", "keep-epochs", "list-variants")
    args = cli.parse_args(argv)
    return interruptible("train.py", lambda: run(args))


def run(args):
    if args.list_variants:
        print("\n".join(list_variants(extra=True)))
        return 0
    try:
        config = RunConfig.from_args(args)
    except RunError as error:
        return fail("train.py", error)
    # Training loads Keras and the backend, so it is imported once the command line is known to be good.
    from experiments.data import DataError
    from experiments.metrics import format_table
    from experiments.models import EvaluationError
    from experiments.training import TrainingDiverged, train

    try:
        out = args.out or os.path.join("runs", f"{config.variant}_{config.dataset}_seed{config.seed}")
        metrics = train(config, out, export_dir=args.export, distribute=args.distribute, keep_epochs=args.keep_epochs)
    except (RunError, DataError, EvaluationError) as error:  # the last: a trained run's best.keras damaged since
        return fail("train.py", error)
    except TrainingDiverged as error:
        print(f"train.py: {error}", file=sys.stderr)
        return 3
    print(format_table(metrics))
    print(f"run folder: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
