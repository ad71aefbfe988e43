"""Statistics of a benchmark over seeds, read from its run folders.

A cell is one row of a results table: runs of the same settings that differ
only in their seed, one run folder `seed<k>/` each, all in one cell folder
(`runs/mnist/favor-rope/`). `aggregate` reads every finished run (a folder with
metrics.json) of every planned cell and returns one JSON-ready dict:

* per cell, each metric's mean, sample standard deviation (ddof=1), min, max
  and 95% confidence interval of the mean over seeds, Student t:
      mean +- t_{0.975, n-1} * std / sqrt(n)       (null for n < 2)
  for test accuracy, macro F1, log-likelihood, AIC, BIC, training seconds per
  epoch and inference ms per image; parameters and FLOPs (equal for every
  seed); epochs to 90/95/99% validation accuracy (mean over the seeds that
  got there, and how many did); the validation accuracy curve's mean and std
  per epoch, and its largest fall below its best earlier epoch (per seed with
  its epoch, and summarised: a collapse the run recovered from); where a run
  folder holds a favor_floor.json, the largest share of a layer's attention
  on FAVOR+'s epsilon floor that it measured (`favor_floor.largest_floor_mass`);
* paired comparisons over the seeds two cells share: d_s = acc_s(cell) -
  acc_s(baseline), summarised like a metric. Seed s of two variants shares
  its data order, so pairing removes the seed's own luck from the gap.
  Each row of the main table is compared with softmax-absolute (the plain
  softmax ViT), with softmax at the same position and, for a relative
  position, with its own kernel at absolute positions; each init-from run
  with the same variant trained from scratch;
* the 2 x 2 of position (absolute, a relative one) x q/k normalisation
  wherever the normalize_qk rows complete it (`normalization_contrasts`):
  the position's effect at a fixed normalisation, the normalisation's at a
  fixed position, a linear kernel's gap to softmax and the gap closed by
  the position within each normalisation;
* what the finished runs cost: hours of training epochs per dataset, per
  device and XLA setting, and per part of the queue (`compute_time`).

The statistics are `significance.py` (paired t, Holm over the family of
main-table comparisons, minimum detectable difference, test-set sampling error).
"""

import collections
from pathlib import Path

import numpy as np

from experiments import atomic, significance
from experiments.favor_floor import FloorError, largest_floor_mass
from experiments.history import HistoryError, largest_fall, read_history, validation_curve
from experiments.metrics import read_metrics
from experiments.run_config import EXECUTION_FIELDS
from experiments.setting_ablations import SETTING_ABLATIONS
from performer_keras.registry import POSITIONS, ignored_options, main_kernels, normalizes_qk

CONFIDENCE = significance.CONFIDENCE
BASELINE = "softmax-absolute"
# Metrics summarised over seeds (mean, std, min, max, interval).
SUMMARISED = (
    "test_accuracy", "macro_f1", "log_likelihood", "nll_per_image", "expected_calibration_error", "aic", "bic",
    "train_seconds_per_epoch", "latency_ms_batch1", "latency_ms_batch256",
)
# Every paired comparison of the main table, one family for Holm's adjustment.
COMPARISONS = ("gap_to_softmax", "gap_to_softmax_same_position", "gain_over_absolute", "interaction")
# Properties of the architecture, equal for every seed.
CONSTANT = ("params", "flops_per_image")
EPOCHS_TO = ("epochs_to_90", "epochs_to_95", "epochs_to_99")
PER_SEED = SUMMARISED + CONSTANT + EPOCHS_TO + ("device", "backend", "test_examples")


def summarize(values):
    """n, mean, std (ddof=1), min, max and the 95% Student-t interval of `values`.

    None values are dropped; no value at all gives None. With one value the
    spread is unknown: std and ci95 are None.
    """
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    n = len(values)
    std = float(np.std(values, ddof=1)) if n > 1 else None
    return {"n": n, "mean": float(np.mean(values)), "std": std, "min": min(values), "max": max(values),
            "ci95": significance.t_interval(values, CONFIDENCE)}


def paired_difference(values, baseline, minus=None, minus_baseline=None):
    """`significance.paired_test` of values[s] - baseline[s] over the seeds s both have (dicts seed -> value).

    With `minus` and `minus_baseline` the difference of differences
    (values[s] - baseline[s]) - (minus[s] - minus_baseline[s]) over the seeds
    all four have: the interaction. Returns the test plus "seeds" (the common
    seeds), or None when no seed is shared.
    """
    series = [values, baseline] + ([minus, minus_baseline] if minus is not None else [])
    seeds = sorted(set.intersection(*(set(k for k, v in x.items() if v is not None) for x in series)))
    if not seeds:
        return None
    differences = [values[s] - baseline[s] - (minus[s] - minus_baseline[s] if minus is not None else 0.0) for s in seeds]
    return {"seeds": seeds, **significance.paired_test(differences)}


def epochs_to_summary(values):
    """{"reached": k, "of": n, "mean": mean over the k seeds that reached the threshold}."""
    reached = [v for v in values if v is not None]
    return {"reached": len(reached), "of": len(values), "mean": float(np.mean(reached)) if reached else None}


def curve_summary(curves):
    """Mean, std (ddof=0: a band, not an interval) and count per epoch of several curves."""
    by_epoch = {}
    for epochs, accuracies in curves:
        for epoch, accuracy in zip(epochs, accuracies):
            by_epoch.setdefault(epoch, []).append(accuracy)
    epochs = sorted(by_epoch)
    return {
        "epochs": epochs,
        "mean": [float(np.mean(by_epoch[e])) for e in epochs],
        "std": [float(np.std(by_epoch[e])) for e in epochs],
        "n": [len(by_epoch[e]) for e in epochs],
    }


def seed_folders(cell_dir):
    """{seed: folder} of the `seed<k>` folders in `cell_dir`."""
    cell_dir = Path(cell_dir)
    if not cell_dir.is_dir():
        return {}
    return {
        int(folder.name[4:]): folder
        for folder in cell_dir.iterdir()
        if folder.is_dir() and folder.name.startswith("seed") and folder.name[4:].isdigit()
    }


def aggregate_cell(root, cell):
    """Statistics of one cell.

    Args:
        root: the profile's results folder; `cell["directory"]` is relative to it.
        cell: {"experiment", "dataset", "variant", "label", "directory",
            "seeds" (planned), "setting"} as `benchmark.cells` makes them.

    Every finished seed folder in the cell counts, planned or not; planned
    seeds without metrics.json are listed as missing. Configs that differ in
    more than the seed are flagged in "mixed_config" (never silently averaged).
    """
    runs, configs, curves, commits, xla, minutes = {}, {}, [], {}, {}, {}
    for seed, folder in sorted(seed_folders(Path(root) / cell["directory"]).items()):
        metrics = read_metrics(folder)
        try:
            config = atomic.read_json_object(folder / "config.json")
        except (OSError, ValueError):
            config = None
        if metrics is None or config is None:
            continue  # unfinished, or a file of it damaged (`read_metrics`)
        configs[seed] = config
        runs[seed] = {key: metrics.get(key) for key in PER_SEED}
        sessions = read_sessions(folder)
        commits[str(seed)] = list(dict.fromkeys(str(session.get("commit")) for session in sessions))
        xla[str(seed)] = ran_with_xla(configs[seed], sessions)
        try:
            history = read_history(folder / "history.csv")
        except HistoryError as error:  # the test metrics stand; the curve, its fall and the time are named, not guessed
            runs[seed]["val_fall"] = {"damaged": str(error)}
        else:
            curves.append(validation_curve(history))
            runs[seed]["val_fall"] = largest_fall(curves[-1])
            minutes[str(seed)] = sum(float(row["epoch_seconds"]) for row in history) / 60
        try:
            runs[seed]["favor_floor"] = largest_floor_mass(folder)
        except FloorError as error:  # a side file: the report names it in its cell instead of stopping
            runs[seed]["favor_floor"] = {"damaged": str(error)}
    result = dict(cell)
    result["seeds"] = {"planned": list(cell["seeds"]), "finished": sorted(runs),
                       "missing": [s for s in cell["seeds"] if s not in runs]}
    result["per_seed"] = {str(seed): values for seed, values in runs.items()}
    result["commits"] = commits
    result["jit_compile"] = xla
    result["timed_on"] = timing_groups(runs, xla)
    result["epoch_minutes"] = minutes
    # init_from names the same seed's checkpoint, so it differs by design.
    shared = [{k: v for k, v in config.items() if k not in ("seed", "init_from", *EXECUTION_FIELDS)}
              for config in configs.values()]
    result["config"] = shared[0] if shared else None
    result["mixed_config"] = sorted({k for config in shared for k in config if config[k] != shared[0].get(k)})
    for key in SUMMARISED:
        result[key] = summarize([values[key] for values in runs.values()])
    for key in CONSTANT:
        result[key] = next((values[key] for values in runs.values() if values[key] is not None), None)
    for key in EPOCHS_TO:
        result[key] = epochs_to_summary([values[key] for values in runs.values()])
    result["val_accuracy_curve"] = curve_summary(curves)
    result["val_fall"] = summarize([(values["val_fall"] or {}).get("fall") for values in runs.values()])
    # All seeds are scored on the same test images, so this error does not shrink with more seeds.
    test_examples = next((values["test_examples"] for values in runs.values() if values["test_examples"]), None)
    mean_accuracy = (result["test_accuracy"] or {}).get("mean")
    result["test_sampling_error"] = {
        "test_examples": test_examples,
        "standard_error": significance.binomial_standard_error(mean_accuracy, test_examples),
    }
    return result


def timing_groups(runs, xla):
    """[{"device", "jit_compile", "seeds"}] of a cell's finished runs, largest group first.

    Timings depend on the machine and on XLA, so they compare only within one group.
    """
    groups = {}
    for seed, values in runs.items():
        groups.setdefault((values["device"], xla[str(seed)]), []).append(seed)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), str(item[0])))
    return [{"device": device, "jit_compile": jit, "seeds": seeds} for (device, jit), seeds in ordered]


def _group_seeds(cell, device, jit_compile):
    return next((g["seeds"] for g in cell.get("timed_on", []) if (g["device"], g["jit_compile"]) == (device, jit_compile)), [])


def group_mean(cell, device, jit_compile, key):
    """Mean `key` over the cell's runs on `device` with XLA `jit_compile`; None without such runs or values."""
    values = [cell["per_seed"][str(seed)][key] for seed in _group_seeds(cell, device, jit_compile)]
    return float(np.mean(values)) if values and None not in values else None


def timing_ratio(cell, base, key):
    """Mean `key` of `cell` over that of `base`, from the runs of one (device, XLA) group they share.

    Returns None when no group holds timed runs of both; else {"ratio",
    "device", "jit_compile", "runs": [of cell, of base]} for the group with the most runs.
    """
    groups = [(g["device"], g["jit_compile"]) for g in cell.get("timed_on", [])]
    shared = [group for group in groups if _group_seeds(base, *group)]
    for group in sorted(shared, key=lambda group: -len(_group_seeds(cell, *group)) - len(_group_seeds(base, *group))):
        value, base_value = group_mean(cell, *group, key), group_mean(base, *group, key)
        if value is not None and base_value:
            return {"ratio": value / base_value, "device": group[0], "jit_compile": group[1],
                    "runs": [len(_group_seeds(cell, *group)), len(_group_seeds(base, *group))]}
    return None


def shared_timing_groups(cells):
    """The (device, XLA) groups (`timing_groups`) that timed runs of `cells`, the one that timed the most cells
    first (ties by name)."""
    counts = collections.Counter((g["device"], g["jit_compile"]) for cell in cells for g in cell.get("timed_on", []))
    return sorted(counts, key=lambda group: (-counts[group], str(group)))


def common_timing_group(cells):
    """The (device, XLA) group that timed runs of the most `cells`, or None: one axis for a latency figure."""
    return next(iter(shared_timing_groups(cells)), None)


def accuracies(cell):
    """{seed: test accuracy} of an aggregated cell."""
    return {int(seed): values["test_accuracy"] for seed, values in cell["per_seed"].items()}


def add_comparisons(cells):
    """Attach the paired accuracy differences that answer the question, in place.

    variants rows: "gap_to_softmax" (vs softmax-absolute of the same dataset),
    "gap_to_softmax_same_position" (vs softmax-<position>) and, for relative
    positions, "gain_over_absolute" (vs <kernel>-absolute: what the position
    itself buys the kernel) and, for a kernel other than softmax,
    "interaction": the gap to softmax at this position minus the gap at
    absolute positions, (K-P - softmax-P) - (K-absolute - softmax-absolute),
    which is the question itself: does the position close (> 0) the gap;
    init_from rows: "gain_over_scratch" (vs the variant trained from scratch);
    num_features rows: `num_features_comparisons`; the setting ablations'
    rows (`setting_ablations`): `setting_comparisons`. Like the init_from
    rows these are outside the Holm family.
    """
    rows = {(c["dataset"], c["variant"]): c for c in cells if c["experiment"] == "variants"}
    settings = {(c["experiment"], c["dataset"], c["variant"], c["setting"][c["experiment"]]): c
                for c in cells if c["experiment"] in SETTING_ABLATIONS}
    for cell in cells:
        kernel, _, position = cell["variant"].partition("-")
        if cell["experiment"] == "variants":
            comparisons = [("gap_to_softmax", BASELINE), ("gap_to_softmax_same_position", f"softmax-{position}")]
            if position != "absolute":
                comparisons.append(("gain_over_absolute", f"{kernel}-absolute"))
            for key, baseline in comparisons:
                cell[key] = _compare(cell, rows.get((cell["dataset"], baseline)), baseline)
            others = [rows.get((cell["dataset"], v)) for v in (f"softmax-{position}", f"{kernel}-absolute", BASELINE)]
            if position != "absolute" and kernel != "softmax" and all(others):
                cell["interaction"] = _compare(cell, others[0], f"softmax-{position} + ({kernel}-absolute - {BASELINE})",
                                               minus=others[1:])
        elif cell["experiment"] == "init_from":
            scratch = rows.get((cell["dataset"], cell["variant"]))
            cell["gain_over_scratch"] = _compare(cell, scratch, f"{cell['variant']} from scratch")
        elif cell["experiment"] == "num_features":
            num_features_comparisons(cell, rows)
        elif cell["experiment"] in SETTING_ABLATIONS:
            setting_comparisons(cell, rows, settings)
    return cells


def num_features_comparisons(cell, rows):
    """A num_features row against the variant row and against softmax at its position, in place.

    "change_from_profile_m": vs the variant row (the profile's m), so that a
    difference in m is read over the seeds both share, not from two means;
    "gap_to_softmax_same_m": vs softmax-<position>'s variant row (softmax
    reads no m). Nothing for the column at the profile's m: it is the variant
    row's own folder. `rows`: {(dataset, variant): variant row}.
    """
    dataset, variant = cell["dataset"], cell["variant"]
    own = rows.get((dataset, variant))
    if own is not None and own["directory"] == cell["directory"]:
        return
    position = variant.partition("-")[2]
    cell["change_from_profile_m"] = _compare(cell, own, f"{variant} at the profile's m")
    cell["gap_to_softmax_same_m"] = _compare(cell, rows.get((dataset, f"softmax-{position}")), f"softmax-{position}")


def setting_comparisons(cell, rows, settings):
    """A setting ablation's row against the variant row and against softmax at the same value, in place.

    With ablation A (`setting_ablations.SETTING_ABLATIONS`) and its `key`s:
    "change_from_profile_<A>" (vs the variant row, the profile's value) and,
    for a kernel other than softmax, "gap_to_softmax_same_<A>" (vs softmax at
    the same position and value: its ablation row, or its variant row when
    softmax does not read the field, as it reads no stabiliser); where
    softmax was trained at the value, "gap_closed_by_<A>": the gap to softmax
    at this value minus the gap at the profile's (against softmax's own row
    it would repeat the change); and for a relative position P,
    "interaction_same_<A>": the main table's interaction at this value,
    (K-P - softmax-P) - (K-absolute - softmax-absolute), all at the value:
    does the position close the gap that is left. `rows`: {(dataset,
    variant): variant row}; `settings`: {(experiment, dataset, variant,
    value): ablation row}.
    """
    ablation, dataset, variant = SETTING_ABLATIONS[cell["experiment"]], cell["dataset"], cell["variant"]
    value = cell["setting"][ablation.field]
    kernel, _, position = variant.partition("-")
    own = rows.get((dataset, variant))
    cell[ablation.key("change_from_profile")] = _compare(cell, own, f"{variant} {ablation.profile_words()}")
    if kernel == "softmax":
        return

    def at_value(name):
        """(the cell of `name` at the value, its name in a baseline)."""
        if ablation.field in ignored_options(*name.split("-", 1)):
            return rows.get((dataset, name)), name
        return settings.get((ablation.field, dataset, name, value)), f"{name} {ablation.value_words(value)}"

    softmax, softmax_name = at_value(f"softmax-{position}")
    cell[ablation.key("gap_to_softmax_same")] = _compare(cell, softmax, softmax_name)
    softmax_row = rows.get((dataset, f"softmax-{position}"))
    if softmax is not softmax_row:
        cell[ablation.key("gap_closed_by")] = _compare(
            cell, softmax, f"{softmax_name} + ({variant} - softmax-{position}, the profile's {ablation.noun})",
            minus=(own, softmax_row))
    if position != "absolute":
        (absolute, absolute_name), (softmax_absolute, softmax_absolute_name) = (
            at_value(f"{kernel}-absolute"), at_value(BASELINE))
        cell[ablation.key("interaction_same")] = _compare(
            cell, softmax, f"{softmax_name} + ({absolute_name} - {softmax_absolute_name})",
            minus=(absolute, softmax_absolute))


def normalization_index(cells):
    """{(dataset, kernel, position, normalised): cell} of the variant rows and the normalize_qk rows."""
    index = {}
    for cell in cells:
        if cell["experiment"] in ("variants", "normalize_qk"):
            kernel, _, position = cell["variant"].partition("-")
            index[(cell["dataset"], kernel, position, normalizes_qk(position, cell["setting"].get("normalize_qk")))] = cell
    return index


def relative_positions(keys):
    """The relative positions among `normalization_index` keys, in the registry's order."""
    present = {position for _, _, position, _ in keys}
    return [position for position in POSITIONS if position != "absolute" and position in present]


def normalization_contrasts(cells):
    """Paired contrasts of the position x q/k normalisation 2 x 2, per dataset, kernel and relative position.

    The four cells of a kernel and a relative position P are <kernel>-absolute
    and <kernel>-P at their default normalisation (the variant rows: off, and
    on for kerple) and switched (the normalize_qk rows). Outside the Holm
    family: they separate the position from the normalisation, and the main
    table is the question. For a linear kernel the gap to softmax is read
    at each normalisation too. Returns [{"dataset", "kernel", "contrast",
    "baseline", **paired test}] for every contrast whose cells all exist,
    each contrast once (the normalisation's at absolute positions is shared
    by every P).
    """
    index = normalization_index(cells)
    switched = [key for key, cell in index.items() if cell["experiment"] == "normalize_qk"]
    contrasts = []
    for dataset, kernel in dict.fromkeys((d, k) for d, k, _, _ in switched):
        def cell(position, normalized, kernel=kernel):
            return index.get((dataset, kernel, position, normalized))

        def name(position, normalized, kernel=kernel):
            return f"{kernel}-{position} (q/k norm {'on' if normalized else 'off'})"

        wanted = []
        for position in relative_positions(key for key in switched if key[:2] == (dataset, kernel)):
            wanted += [(f"{position} - absolute, q/k norm {state}", cell(position, on), cell("absolute", on),
                        name("absolute", on)) for state, on in (("on", True), ("off", False))]
            wanted += [(f"q/k norm on - off, {p}", cell(p, True), cell(p, False), name(p, False))
                       for p in ("absolute", position)]
            for state, on in (("on", True), ("off", False)):
                if kernel != "softmax":
                    wanted += [(f"gap to softmax, {p}, q/k norm {state}", cell(p, on), cell(p, on, "softmax"),
                                name(p, on, "softmax")) for p in ("absolute", position)]
                    others = [cell(position, on, "softmax"), cell("absolute", on), cell("absolute", on, "softmax")]
                    wanted.append((f"gap closed by {position}, q/k norm {state}", cell(position, on), others,
                                   f"softmax-{position} + ({kernel}-absolute - softmax-absolute), all q/k norm {state}"))
        for contrast, first, rest, baseline in {w[0]: w for w in wanted}.values():
            rest = rest if isinstance(rest, list) else [rest]
            if first is None or not all(rest):
                continue
            test = paired_difference(*(accuracies(c) for c in [first] + rest))
            if test:
                contrasts.append({"dataset": dataset, "kernel": kernel, "contrast": contrast, "baseline": baseline, **test})
    return contrasts


def _compare(cell, other, baseline, minus=()):
    """The paired accuracy difference cell - other, named by `baseline`; None without `other`.

    With `minus` = (a, b) the difference of differences (cell - other) - (a - b),
    an interaction; None unless every cell exists. `baseline` names what the
    cell is measured against, so that the difference reads "cell - baseline"
    with its signs: for an interaction "other + (a - b)".
    """
    cells = [cell, other, *minus]
    if not all(cells):
        return None
    return {"baseline": baseline, **(paired_difference(*(accuracies(c) for c in cells)) or {})}


def family(cells):
    """[(cell, key)] of the distinct paired comparisons of the main table, the family Holm adjusts over.

    A comparison that repeats another of the same row (kernel-absolute against
    softmax at the same position is its gap to softmax-absolute; softmax-P
    against softmax-absolute is its gain over absolute) is counted once.
    Extra rows and init-from runs are outside the family: they are not the
    question.
    """
    members = []
    for cell in cells:
        kernel, _, position = cell["variant"].partition("-")
        if cell["experiment"] != "variants" or kernel not in main_kernels() or cell["variant"] == BASELINE:
            continue
        for key in COMPARISONS:
            repeated = (position == "absolute" and key == "gap_to_softmax_same_position") or (
                kernel == "softmax" and key != "gap_to_softmax")
            if not repeated and (cell.get(key) or {}).get("p_value") is not None:
                members.append((cell, key))
    return members


def adjust_family(cells):
    """Holm-adjust the family's p-values in place ("p_holm", "verdict"); returns its size."""
    members = family(cells)
    adjusted = significance.holm([cell[key]["p_value"] for cell, key in members])
    for (cell, key), p_holm in zip(members, adjusted):
        cell[key]["p_holm"] = p_holm
        cell[key]["verdict"] = significance.verdict(cell[key], p_holm)
    return len(members)


def read_sessions(folder):
    """The training sessions of a run, in order, from its provenance.json ([] when it has none)."""
    try:
        sessions = atomic.read_json_object(Path(folder) / "provenance.json").get("sessions")
    except (OSError, ValueError):
        return []
    return sessions if isinstance(sessions, list) else []


def ran_with_xla(config, sessions):
    """Whether XLA compiled a run's training step: its config's explicit choice, else what its sessions recorded.

    Sessions recorded before provenance kept the setting ran with Keras'
    "auto", the default then: XLA on JAX, none for TensorFlow on a CPU.
    """
    if isinstance(config.get("jit_compile"), bool):
        return config["jit_compile"]
    return bool(sessions) and all(session.get("jit_compile", session.get("keras_backend") == "jax")
                                  for session in sessions)


def detectable_in_sd(cells):
    """{n: MDE of n pairs in units of the pairs' standard deviation} for every planned seed count of `cells`.

    What more seeds buy, independent of any spread measured: the report
    quotes it beside the MDEs of the comparisons.
    """
    counts = sorted({len(cell["seeds"]["planned"]) for cell in cells} - {0, 1})
    return {str(n): significance.minimum_detectable_difference(1.0, n) for n in counts}


def is_main_variant(variant):
    """Whether `variant` is a row of the main table (its kernel is one of `main_kernels`)."""
    return variant.partition("-")[0] in main_kernels()


def queue_part(experiment, variant, seed, main_seeds):
    """The part of a profile's queue a run belongs to: "main table", "more seeds" (a main-table row's seeds
    beyond `main_seeds`, the profile's seeds), "extra rows" (kernels outside the main table) or its ablation's
    name (the experiment)."""
    if experiment != "variants":
        return experiment
    if not is_main_variant(variant):
        return "extra rows"
    return "main table" if int(seed) in main_seeds else "more seeds"


def compute_time(cells, main_seeds):
    """What the finished runs cost: per dataset, per (device, XLA) group and per part of the queue.

    A run's minutes are the sum of its history.csv's epoch_seconds: the
    training epochs only (compilation, evaluation and checkpoints are not
    counted), over every session that trained it. A run shared by two cells
    counts once, in the first cell's part. Returns {dataset: {"runs", "hours",
    "groups": [{"device", "jit_compile", "runs", "hours", "minutes": {"min",
    "median", "max"}}], "parts": [{"part", "runs", "hours"}]}}, groups largest
    first, parts in queue order (`queue_part` with `main_seeds`); a part's sum
    stops changing once it is whole, so a docstring can quote it.
    """
    runs = {}
    for cell in cells:
        for seed, minutes in cell["epoch_minutes"].items():
            runs.setdefault(f"{cell['directory']}/seed{seed}", (
                cell["dataset"], cell["per_seed"][seed]["device"], cell["jit_compile"][seed],
                queue_part(cell["experiment"], cell["variant"], seed, main_seeds), minutes))
    result = {}
    for dataset in dict.fromkeys(run[0] for run in runs.values()):
        groups, parts = {}, {}
        for run_dataset, device, jit, part, minutes in runs.values():
            if run_dataset == dataset:
                groups.setdefault((device, jit), []).append(minutes)
                parts.setdefault(part, []).append(minutes)
        ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), str(item[0])))
        result[dataset] = {
            "runs": sum(len(values) for values in groups.values()),
            "hours": sum(sum(values) for values in groups.values()) / 60,
            "groups": [{"device": device, "jit_compile": jit, "runs": len(values), "hours": sum(values) / 60,
                        "minutes": {"min": min(values), "median": float(np.median(values)), "max": max(values)}}
                       for (device, jit), values in ordered],
            "parts": [{"part": part, "runs": len(values), "hours": sum(values) / 60} for part, values in parts.items()],
        }
    return result


def aggregate(root, cells, **header):
    """Aggregate `cells` (see `aggregate_cell`) of the results folder `root`.

    Args:
        root: the profile's results folder.
        cells: the planned cells, in table order.
        **header: extra JSON fields (profile, commands, ...).

    Returns: {**header, "confidence", "runs": {"planned", "finished", "missing"},
    "devices", "backends", "normalization", "compute", "cells": [...]}.
    """
    aggregated = add_comparisons([aggregate_cell(root, cell) for cell in cells])
    family_size = adjust_family(aggregated)
    runs = {}  # folder -> finished?, each run once (a cell may be shared)
    for cell in aggregated:
        for seed in cell["seeds"]["planned"]:
            runs[f"{cell['directory']}/seed{seed}"] = seed in cell["seeds"]["finished"]
    per_seed = [values for cell in aggregated for values in cell["per_seed"].values()]
    return {
        **header,
        "confidence": CONFIDENCE,
        "family": {"size": family_size, "adjustment": "holm", "alpha": significance.ALPHA, "power": significance.POWER,
                   "members": list(COMPARISONS), "detectable_in_sd": detectable_in_sd(aggregated)},
        "runs": {
            "planned": len(runs), "finished": sum(runs.values()),
            "missing": [folder for folder, done in runs.items() if not done],  # queue order
        },
        # Every commit that trained a finished run: more than one means the table mixes code versions.
        "commits": sorted({commit for cell in aggregated for run in cell["commits"].values() for commit in run}),
        # Finished runs whose steps XLA compiled (a run shared by two cells counts once).
        "xla_runs": len({f"{cell['directory']}/seed{seed}" for cell in aggregated
                         for seed, jit in cell["jit_compile"].items() if jit}),
        "devices": sorted({v["device"] for v in per_seed if v["device"]}),
        "backends": sorted({v["backend"] for v in per_seed if v["backend"]}),
        "normalization": normalization_contrasts(aggregated),
        "compute": compute_time(aggregated, header["seeds"]),
        "cells": aggregated,
    }


def write_aggregate(root, cells, **header):
    """`aggregate` and write it to `root`/aggregate.json; returns the dict."""
    result = aggregate(root, cells, **header)
    Path(root).mkdir(parents=True, exist_ok=True)
    atomic.write_json(Path(root) / "aggregate.json", result, indent=1, sort_keys=False)
    return result
