"""Which setting of the cpu profile opens a softmax-Performer gap? The pilots' summary.

    python -m experiments.benchmark --profile pilot-d16      # and pilot-d32: the runs
    python -m experiments.pilots                              # results/cpu-pilots/README.md + pilots.json

Each pilot (`benchmark_profiles.PILOTS`) trains softmax-absolute,
favor-absolute and relu-absolute with 2 seeds. The pilots are judged on the
validation split only (the best epoch's validation accuracy, the epoch
best.keras keeps), never on the test split, so choosing the setting does not
spend the test set. Per setting: each variant's mean validation accuracy,
the paired gap softmax - kernel with its 95% interval, and the CPU hours a run
took (sum of its epochs' seconds), so the gap per CPU hour can be compared.
"""

import sys
from pathlib import Path

from experiments import atomic
from experiments.benchmark_profiles import PILOTS
from experiments.aggregate import BASELINE, paired_difference, seed_folders, summarize
from experiments.cli import fail, parser
from experiments.history import HistoryError, read_history
from experiments.run_config import read_recorded

PILOT_ROOT = "cpu-pilots"


def run_summary(folder):
    """(best validation accuracy, training hours) of one run folder, or None while unfinished; HistoryError where
    the finished run's history.csv has no validated epoch (a bare `max()` error once)."""
    if not (folder / "metrics.json").is_file():
        return None
    rows = read_history(folder / "history.csv")
    validated = [float(row["val_accuracy"]) for row in rows if row.get("val_accuracy")]
    if not validated:
        raise HistoryError(f"{folder / 'history.csv'} has no epoch with a validation accuracy, yet the run finished")
    return max(validated), sum(float(row["epoch_seconds"]) for row in rows) / 3600


def summarize_pilot(root, setting):
    """One pilot setting: {"setting", "config", "variants": {variant: {...}}, "gaps": {variant: paired}}."""
    cells = sorted((Path(root) / setting / "runs").glob("*/*"))
    variants, config = {}, None
    for cell in cells:
        runs = {seed: run_summary(folder) for seed, folder in seed_folders(cell).items()}
        runs = {seed: value for seed, value in runs.items() if value is not None}
        if not runs:
            continue
        if config is None:
            config = read_recorded(cell / f"seed{min(runs)}" / "config.json").to_dict()
        variants[cell.name] = {
            "dataset": cell.parent.name,
            "val_accuracy": summarize([v[0] for v in runs.values()]),
            "per_seed": {str(seed): v[0] for seed, v in runs.items()},
            "hours_per_run": summarize([v[1] for v in runs.values()])["mean"],
        }
    gaps = {}
    softmax = variants.get(BASELINE)
    for variant, values in variants.items():
        if softmax is None or variant == BASELINE:
            continue
        kernel = {int(s): v for s, v in values["per_seed"].items()}
        gap = paired_difference({int(s): v for s, v in softmax["per_seed"].items()}, kernel)
        if gap:
            hours = sum(v["hours_per_run"] for v in (values, softmax))
            gaps[variant] = {**gap, "gap_per_cpu_hour": gap["mean"] / hours}
    shared = {k: v for k, v in (config or {}).items() if k not in ("variant", "seed")}
    return {"setting": setting, "config": shared, "variants": variants, "gaps": gaps}


def single_runs(root, settings):
    """Runs under `root` outside the pilot settings (train.py runs of one recipe), as table rows."""
    rows = []
    for metrics in sorted(Path(root).rglob("metrics.json")):
        folder = metrics.parent
        if folder.relative_to(root).parts[0] in settings:
            continue
        config = read_recorded(folder / "config.json").to_dict()
        accuracy, hours = run_summary(folder)
        rows.append({"folder": str(folder.relative_to(root)), "config": config, "val_accuracy": accuracy, "hours": hours})
    return rows


RECIPE_KEYS = ("dataset", "variant", "size", "width", "depth", "heads", "num_features", "batch_size", "learning_rate", "epochs", "augment")


def render(summaries, singles=()):
    lines = [
        "# Pilots of the `cpu` profile: where is the softmax-Performer gap?", "",
        "Judged on the validation split only (best epoch's validation accuracy, percent); the gap is softmax-absolute "
        "minus the kernel, paired over seeds, in percentage points with its 95% Student-t interval; hours are the "
        "training time of one run on this 2-core CPU (TensorFlow), and gap per CPU hour divides the gap by the hours "
        "of the softmax run plus the kernel's run. Made by `python -m experiments.pilots` from the run folders "
        "below it; the runs by `python -m experiments.benchmark --profile pilot-<setting>` (one per setting). "
        "Which setting the `cpu` profile took, and why, is in its docstring (`performer_keras/benchmark_profiles.py`).", "",
        "| setting | settings that differ | variant | val. accuracy % (seeds) | gap to softmax, points [95% CI] | hours/run | gap per CPU hour |",
        "|---|---|---|---|---|---|---|",
    ]
    base = summaries[0]["config"] if summaries else {}
    for summary in summaries:
        differs = ", ".join(f"{k}={v}" for k, v in summary["config"].items() if base.get(k) != v) or "(the first)"
        for variant, values in summary["variants"].items():
            acc = values["val_accuracy"]
            gap = summary["gaps"].get(variant)
            ci = "" if not gap or gap["ci95"] is None else f" [{100 * gap['ci95'][0]:.2f}, {100 * gap['ci95'][1]:.2f}]"
            gap_text = "–" if not gap else f"{100 * gap['mean']:+.2f}{ci}"
            per_hour = "–" if not gap else f"{100 * gap['gap_per_cpu_hour']:+.2f}"
            lines.append(
                f"| {summary['setting']} | {differs} | {variant} | {100 * acc['mean']:.2f} ({acc['n']}) | "
                f"{gap_text} | {values['hours_per_run']:.3f} | {per_hour} |"
            )
    if singles:
        lines += ["", "## Single runs of a recipe", "",
                  "Made with `python train.py` and the settings shown (`--limit all`, full data), into the folder shown; "
                  "judged on the best epoch's validation accuracy.", "",
                  "| folder | settings | val. accuracy % | hours |", "|---|---|---|---|"]
        for row in singles:
            settings = ", ".join(f"{k}={row['config'][k]}" for k in RECIPE_KEYS if row["config"].get(k) is not None)
            lines.append(f"| {row['folder']} | {settings} | {100 * row['val_accuracy']:.2f} | {row['hours']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parser("pilots", __doc__, "results-dir").parse_args(argv)
    root = Path(args.results_dir) / PILOT_ROOT
    try:  # a run's records damaged by hand or disk (HistoryError, RunError among them), each named with its file
        summaries = [summarize_pilot(root, setting) for setting in PILOTS if (root / setting).is_dir()]
        singles = single_runs(root, PILOTS)
    except ValueError as error:
        return fail("pilots", error)
    if not summaries:
        return fail("pilots", f"no pilot runs under {root}")
    atomic.write_json(root / "pilots.json", {"pilots": summaries, "single_runs": singles}, indent=1, sort_keys=False)
    atomic.write_text(root / "README.md", render(summaries, singles))
    print(f"pilots: {root / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
