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

Across machines (KerasTuner's distributed mode, folders on a shared disk): the
same command in a chief process (KERASTUNER_TUNER_ID=chief) and in workers
(KERASTUNER_TUNER_ID=worker0, worker1, ...), all with KERASTUNER_ORACLE_IP and
KERASTUNER_ORACLE_PORT of the chief; README, "Tuning".

Bad input exits with code 2 and one line on stderr.
"""

import argparse
import os
import sys

from experiments.cli import RUN_OPTIONS, UsageError, fail, interruptible, parser

PROG = "python -m tuning"
# The options of a search: the base run's (train.py's) and how it is searched.
SEARCH_OPTIONS = (*RUN_OPTIONS, "algorithm", "max-trials", "space", "space-file", "quiet")


def make_search(args, variant, strict=True):
    """The `Search` of `variant` that the parsed `args` describe.

    With `strict`, a flag or a --space entry that the variant ignores is an
    error; a sweep over several variants passes strict=False and each variant
    takes what it uses.
    """
    from experiments.run_config import RunConfig
    from tuning import search_spaces
    from tuning.search import Search, check_not_fixed

    args = argparse.Namespace(**{**vars(args), "variant": variant})
    config = RunConfig.from_args(args, strict=strict)
    overrides = search_spaces.parse_overrides(args.space, args.space_file)
    space = search_spaces.space_for(config, overrides, strict=strict)
    check_not_fixed(space, {name: getattr(args, name, None) for name in space})
    return Search(config, space, algorithm=args.algorithm, max_trials=args.max_trials)


def exit_status(prog, command):
    """Run `command()` and return its exit status; a user error gives 2,
    a search with no finished trial 1 and Ctrl-C 130, each with one line on stderr."""
    from experiments.run_config import RunError

    try:
        return interruptible(prog, command)
    except (UsageError, RunError) as error:
        return fail(prog, error)
    except Exception as error:
        # Raised after the search modules loaded (they load TensorFlow, so only then).
        from experiments.data import DataError
        from tuning.search import SearchError, SearchFailed

        if isinstance(error, (SearchError, DataError)):
            return fail(prog, error)
        if isinstance(error, SearchFailed):
            print(f"{prog}: {error}", file=sys.stderr)
            return 1
        raise


def main(argv=None):
    cli = parser(PROG, __doc__, *SEARCH_OPTIONS, "out", "show-space")
    cli.add_argument("variant_name", nargs="?", metavar="VARIANT", help="e.g. favor-rope (see train.py --list-variants)")

    def tune():
        args = cli.parse_args(argv)
        # The search loads KerasTuner and the backend, so it is imported once the command line parsed.
        from tuning import search_spaces
        from tuning.search import default_out, run_search

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
        result = run_search(search, out, verbose=0 if args.quiet else 1)
        if result is None:
            print(f"worker {os.environ.get('KERASTUNER_TUNER_ID')}: no trials left; the chief writes the results in {out}")
            return 0
        best, confirmation = result["best"], result["confirmation"]
        print(f"best: trial {best['trial_id']}, val_accuracy {best['val_accuracy']:.4f} "
              f"(confirmed over seeds {confirmation['seeds']}: mean {confirmation['mean']:.4f})")
        print(f"results: {out} (best_hparams.json, summary.md, tensorboard/)")
        return 0

    return exit_status(PROG, tune)


if __name__ == "__main__":
    sys.exit(main())
