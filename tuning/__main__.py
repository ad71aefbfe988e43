"""Tune one variant: `python -m tuning favor-rope --dataset mnist`.

Examples:
    python -m tuning favor-rope --dataset mnist
    python -m tuning relu-absolute --dataset cifar10 --algorithm bayesian --max-trials 30 --epochs 20
    python -m tuning favor-rope --dataset mnist --space num_features=32,64 --space learning_rate=3e-4:1e-3
    python -m tuning favor-rope --dataset mnist --show-space

Results land in tuning_results/<dataset>/<variant>/ (--out): best_hparams.json
for `train.py --hparams`, summary.md, and tensorboard/ for
`tensorboard --logdir tuning_results`. The same command again resumes the
search. The spaces are in tuning/search_spaces.py.

Bad input exits with code 2 and one line on stderr.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PROG = "python -m tuning"


class UsageError(ValueError):
    """An argparse error, raised so that `main` prints it as one line."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def add_search_arguments(parser):
    """The options shared by `python -m tuning` and `python -m tuning.sweep`."""
    from train import add_run_arguments

    add_run_arguments(parser)
    parser.add_argument("--algorithm", default="hyperband", help="hyperband (default), bayesian or random")
    parser.add_argument("--max-trials", type=int, help="at most N trials (default: 20, or one Hyperband iteration)")
    parser.add_argument("--epochs", type=int, help="epochs per trial (Hyperband: of the longest trials)")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seed", type=int, help="seed of every trial and of the search")
    parser.add_argument("--space", action="append", default=[], metavar="NAME=VALUES",
                        help="narrow or widen a space: learning_rate=1e-4:1e-3 (log-uniform), "
                             "num_features=32,64 (choice), redraw_interval=0 (fixed); repeatable")
    parser.add_argument("--space-file", help="JSON {name: 'low:high' | [values] | value}; --space wins")
    parser.add_argument("--quiet", action="store_true", help="no per-trial output")


def make_search(args, variant, strict=True):
    """The `Search` of `variant` that the parsed `args` describe."""
    from performer_keras.run_config import RunConfig, RunError
    from train import run_config_from_args
    from tuning import search_spaces
    from tuning.search import Search, check_not_fixed

    args = argparse.Namespace(**{**vars(args), "variant": variant})
    config = run_config_from_args(args, RunConfig, RunError)
    overrides = search_spaces.parse_overrides(args.space, args.space_file)
    space = search_spaces.space_for(config, overrides, strict=strict)
    check_not_fixed(space, {name: getattr(args, name, None) for name in space})
    return Search(config, space, algorithm=args.algorithm, max_trials=args.max_trials)


def exit_status(prog, command):
    """Run `command()` and return its exit status; a user error gives 2 and
    a search with no finished trial 1, each with one line on stderr."""
    from performer_keras.data import DataError
    from performer_keras.run_config import RunError
    from tuning.search import SearchError, SearchFailed

    try:
        return command()
    except (UsageError, SearchError, RunError, DataError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except SearchFailed as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 1


def main(argv=None):
    parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variant_name", nargs="?", metavar="VARIANT", help="e.g. favor-rope (see train.py --list-variants)")
    add_search_arguments(parser)
    parser.add_argument("--out", help="results folder (default tuning_results/<dataset>/<variant>)")
    parser.add_argument("--show-space", action="store_true", help="print the search space and exit")

    from tuning import search_spaces
    from tuning.search import default_out, run_search

    def tune():
        args = parser.parse_args(argv)
        if args.variant_name and (args.variant or args.attention or args.position):
            raise UsageError("give the variant once: VARIANT or --variant or --attention/--position")
        variant = args.variant_name or args.variant
        if not (variant or args.attention or args.position):
            raise UsageError("give a VARIANT, e.g. favor-rope (see train.py --list-variants)")
        search = make_search(args, variant)
        if args.show_space:
            print(search_spaces.describe(search.space))
            return 0
        out = args.out or default_out(search.base_config)
        best = run_search(search, out, verbose=0 if args.quiet else 1)["best"]
        print(f"best: trial {best['trial_id']}, val_accuracy {best['val_accuracy']:.4f}")
        print(f"results: {out} (best_hparams.json, summary.md, tensorboard/)")
        return 0

    return exit_status(PROG, tune)


if __name__ == "__main__":
    sys.exit(main())
