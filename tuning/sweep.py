"""Tune several variants in turn and compare the best setting of each.

    python -m tuning.sweep --variants softmax-rope favor-rope relu-rope --dataset mnist
    python -m tuning.sweep --variants all --dataset mnist --size tiny --limit 2000 --epochs 3

Each variant is searched (or its search resumed) in <out>/<variant>/ exactly
as `python -m tuning VARIANT --out <out>/<variant>` would, with the same
options for every variant; `--space` applies to the variants that use the
hyperparameter. Then the best trial of each variant is trained again with
each of `--seeds` other than the search's own (default: the search's seed and
the two after it) in <out>/<variant>/seeds/seed_<s>/, so the table shows how much of a difference
between variants is seed-to-seed noise. Writes <out>/sweep.md and
<out>/sweep.json (default <out>: tuning_results/<dataset>). Run again, it
resumes: finished searches and seed runs are read back, not repeated.

Bad input exits with code 2 and one line on stderr.
"""

import sys
from pathlib import Path

from experiments.cli import VARIANT_OPTIONS, UsageError, expand_variants, parser
from tuning.__main__ import SEARCH_OPTIONS, exit_status, make_search

PROG = "python -m tuning.sweep"


def sweep_seeds(search, seeds=None):
    """The seeds each best trial is measured with: `seeds`, by default the search's seed and the two after it."""
    seed = search.base_config.seed
    return list(dict.fromkeys(seeds)) if seeds else [seed, seed + 1, seed + 2]


def run_sweep(searches, root, seeds=None, verbose=1):
    """Search every variant, retrain each best trial with the other `seeds` (`sweep_seeds`), write the table."""
    from experiments import data
    from tuning.search import confirmation_record, retrain_best, run_search

    root = Path(root)
    base = searches[0].base_config
    splits = data.load_dataset(base.dataset, limit=base.limit)  # every search of a sweep reads the same data
    rows = []
    for search in searches:
        out_dir = root / search.base_config.variant
        result = run_search(search, out_dir, verbose=verbose, splits=splits)
        best = result["best"]
        base_seed = best["config"].seed
        scores = {base_seed: best["val_accuracy"]} if base_seed in sweep_seeds(search, seeds) else {}
        for seed in sweep_seeds(search, seeds):
            if seed != base_seed:
                scores[seed] = retrain_best(out_dir, best, seed, splits, verbose=2 if verbose else 0)["val_accuracy"]
        spread = confirmation_record(scores)
        rows.append({
            "variant": search.base_config.variant,
            "folder": str(out_dir),
            "trials": sum(row["status"] == "COMPLETED" for row in result["trials"]),
            "best_trial": best["trial_id"],
            "val_accuracy": best["val_accuracy"],
            "seed_val_accuracy": spread["val_accuracy"],
            "mean": spread["mean"],
            "std": spread["std"],
            "hyperparameters": {name: getattr(best["config"], name) for name in sorted(search.space)},
        })
    rows.sort(key=lambda row: -row["mean"])
    write_sweep(root, searches[0], sweep_seeds(searches[0], seeds), rows)
    return rows


def write_sweep(root, search, seeds, rows):
    from experiments import atomic
    from tuning.search import format_value

    atomic.write_json(root / "sweep.json", rows)
    config = search.base_config
    names = sorted({name for row in rows for name in row["hyperparameters"]})
    lines = [
        f"# Sweep on {config.dataset}: the best setting of each variant",
        "",
        f"{search.algorithm} search per variant ({search.max_trials or 'one Hyperband iteration of'} trials), "
        f"size {config.size}, {config.epochs} epochs, limit {config.limit}; objective: best val_accuracy "
        "on the validation split.",
        f"Spread: each best trial measured with seeds {', '.join(map(str, seeds))} (seed {config.seed} is the "
        "search's own result, the others are trained again); mean, sample std, min and max over them."
        if len(seeds) > 1 else f"Spread: not measured (--seeds {seeds[0]}).",
        "",
    ]
    header = ["variant", "trials", "best trial", "val_accuracy (search)", f"mean ± std ({len(seeds)} seeds)", "min – max", *names]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        scores = list(row["seed_val_accuracy"].values())
        std = f" ± {row['std']:.4f}" if row["std"] is not None else ""
        cells = [
            row["variant"], str(row["trials"]), row["best_trial"], f"{row['val_accuracy']:.4f}",
            f"{row['mean']:.4f}{std}", f"{min(scores):.4f} – {max(scores):.4f}",
            *(format_value(row["hyperparameters"].get(name, "-")) for name in names),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    atomic.write_text(root / "sweep.md", "\n".join(lines) + "\n")


def main(argv=None):
    options = [name for name in SEARCH_OPTIONS if name not in VARIANT_OPTIONS]
    cli = parser(PROG, __doc__, "variants", *options, "seeds", "out")

    def sweep():
        args = cli.parse_args(argv)
        from experiments.run_config import RunConfig
        from tuning import search_spaces
        from tuning.search import SearchError, check_search_folder

        if not args.variants:
            raise UsageError("give the variants to compare: --variants favor-rope relu-rope ... or --variants all")
        variants = expand_variants(args.variants)
        searches = [make_search(args, variant, strict=False) for variant in variants]
        unused = set(search_spaces.parse_overrides(args.space, args.space_file)) - {
            name for search in searches for name in search.space
        }
        if unused:
            raise SearchError(f"no variant of the sweep uses {sorted(unused)}")
        given = RunConfig.given(args)
        unread = set.intersection(*(set(search.base_config.ignored(given)) for search in searches))
        if unread:
            raise SearchError(f"no variant of the sweep reads {sorted('--' + name.replace('_', '-') for name in unread)}")
        root = Path(args.out or Path("tuning_results") / searches[0].base_config.dataset)
        for search in searches:  # refuse before any search starts
            check_search_folder(search, root / search.base_config.variant)
        run_sweep(searches, root, args.seeds, verbose=0 if args.quiet else 1)
        print((root / "sweep.md").read_text())
        print(f"results: {root}")
        return 0

    return exit_status(PROG, sweep)


if __name__ == "__main__":
    sys.exit(main())
