"""A benchmark's report: results/<profile>/README.md and its figures, from aggregate.json.

    python -m experiments.report --profile small

re-aggregates the profile's run folders into aggregate.json (`aggregate.py`),
then writes, every number taken from that JSON:

    README.md             the main table (variants x datasets), the gap to softmax
                          with intervals and which of them lie above, below or
                          across 0, per-dataset detail, the extra rows, the
                          ablations, and what is still missing
    pareto_<dataset>.png  test accuracy against inference latency, Pareto front
    curves_<dataset>.png  validation accuracy per epoch, mean and band over seeds
    saliency_<dataset>.png  saliency maps of a few test images per variant
    ../README_SECTION.md  for the top-level README: the main table of every
                          profile in results/ with finished runs, and links

Saliency maps need the runs' best.keras checkpoints (not committed; a rerun
of the benchmark remakes them) and the TensorFlow backend: SmoothGrad with
tf-keras-vis, or a plain input gradient through tf.GradientTape where
tf-keras-vis fails; the report says which. Figures use matplotlib's object
API on the Agg canvas, never pyplot.
"""

import json
import os
import sys
from pathlib import Path

from experiments import atomic
from experiments.aggregate import (BASELINE, common_timing_group, group_mean, is_main_variant, normalization_index,
                                  queue_part, relative_positions, shared_timing_groups, timing_ratio)
from experiments.benchmark import commands, profile_root, selected_jobs, write_aggregate
from experiments.forecast import elsewhere_text
from experiments.benchmark_figures import dataset_name, plot_curves, plot_pareto
from experiments.benchmark_profiles import PROFILES, get_profile
from experiments.cli import SELECTION_OPTIONS, fail, parser, start_backend
from experiments.markdown import table_lines
from experiments.run_config import LATER_FIELDS, RunError
from experiments.saliency import SALIENCY_IMAGES, plot_saliency
from experiments.setting_ablations import SETTING_ABLATIONS
from performer_keras.registry import POSITIONS


# === Formatting ===


def _pct(value, digits=2):
    return "–" if value is None else f"{100 * value:.{digits}f}"


def _number(value, digits=1):
    if value is None:
        return "–"
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _interval(summary, scale=100.0, digits=2):
    if not summary or summary.get("ci95") is None:
        return "–"
    low, high = summary["ci95"]
    return f"[{scale * low:.{digits}f}, {scale * high:.{digits}f}]"


def _count(cell):
    seeds = cell["seeds"]
    planned = len(seeds["planned"])
    return f"{len(seeds['finished'])}/{planned}" if planned else str(len(seeds["finished"]))


def accuracy_text(cell):
    """"82.13 ± 0.52 [80.85, 83.41] (3/3)", or "missing (0/3)"."""
    summary = cell["test_accuracy"]
    if summary is None:
        return f"missing ({_count(cell)})"
    spread = "" if summary["std"] is None else f" ± {_pct(summary['std'])}"
    ci = "" if summary["ci95"] is None else f" {_interval(summary)}"
    return f"{_pct(summary['mean'])}{spread}{ci} ({_count(cell)})"


def fall_text(cell):
    """Each seed's largest validation fall, points (epoch of the low): "0: 38.04 (2), 2: 0.12 (6)"; "–" without runs.

    Beside the final accuracy it tells a run that collapsed and recovered from
    one that never fell (`history.largest_fall`).
    """
    falls = [(int(seed), values.get("val_fall")) for seed, values in cell["per_seed"].items()]
    parts = [f"{seed}: {fall['damaged']}" if "damaged" in fall else f"{seed}: {100 * fall['fall']:.2f} ({fall['epoch']})"
             for seed, fall in sorted(falls) if fall]
    return ", ".join(parts) or "–"


FLOOR_WORDS = ("where the run folder holds a favor_floor.json (made by `python -m experiments.favor_floor`, its command "
               "inside), the largest share of one block's attention on FAVOR+'s epsilon floor over the checkpoints it "
               "read (seed: share (block, epochs trained))")


def floor_text(cell):
    """Each seed's largest share of a layer's attention on FAVOR+'s epsilon floor, from its favor_floor.json:
    "0: 0.085 (block 0, epoch 8)"; "–" where no run has the file."""
    parts = []
    for seed, values in sorted(cell["per_seed"].items(), key=lambda item: int(item[0])):
        floor = values.get("favor_floor")
        if floor and "damaged" in floor:
            parts.append(f"{seed}: {floor['damaged']}")
        elif floor:
            layer = floor["layer"].removesuffix("_attention").replace("_", " ")
            parts.append(f"{seed}: {floor['floor_mass']:.3f} ({layer}, epoch {floor['epoch']})")
    return ", ".join(parts) or "–"


def gap_text(gap):
    """A paired difference in percentage points: "-1.23 [-2.50, 0.04] (3 pairs)"."""
    if not gap or "mean" not in gap:
        return "–"
    ci = "" if gap["ci95"] is None else f" {_interval(gap)}"
    return f"{100 * gap['mean']:+.2f}{ci} ({gap['n']} pair{'s' if gap['n'] != 1 else ''})"


def _p(value):
    return "–" if value is None else f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


def test_text(test):
    """A paired test in percentage points: "+1.67 [-1.20, 4.54], p 0.130, Holm 0.518: not separated; MDE 3.77"."""
    if not test or "mean" not in test:
        return "–"
    if test.get("n") == 1:
        return f"{100 * test['mean']:+.2f} (one pair: no interval, no test)"
    text = f"{100 * test['mean']:+.2f} {_interval(test)}, p {_p(test.get('p_value'))}"
    if test.get("p_holm") is not None:
        text += f", Holm {_p(test['p_holm'])}: {test['verdict']}"
    if test.get("mde") is not None:
        text += f"; MDE {100 * test['mde']:.2f}"
    return text


def _mean(summary, scale=1.0, digits=1):
    return "–" if not summary else _number(scale * summary["mean"], digits)


def _epochs_to(cell):
    parts = []
    for key in ("epochs_to_90", "epochs_to_95", "epochs_to_99"):
        value = cell[key]
        parts.append("–" if value["mean"] is None else f"{value['mean']:.1f} ({value['reached']}/{value['of']})")
    return " / ".join(parts)


def _group_text(device, jit_compile):
    return f"{device}, {'XLA' if jit_compile else 'no XLA'}"


def _timings(cell):
    """Seconds per epoch, ms/img at batch 1 and 256, and where: means over the cell's largest (device, XLA) group."""
    group = cell["timed_on"][0]
    where = (group["device"], group["jit_compile"])
    return [_number(group_mean(cell, *where, "train_seconds_per_epoch"), 1),
            _number(group_mean(cell, *where, "latency_ms_batch1"), 3),
            _number(group_mean(cell, *where, "latency_ms_batch256"), 3),
            f"{_group_text(*where)} ({len(group['seeds'])}/{len(cell['per_seed'])})"]


def detail_table(cells):
    header = ["variant", "accuracy % (mean ± std)", "95% CI", "test SE %", "min–max", "macro F1 %", "NLL nats/img",
              "ECE %", "log-lik.", "AIC", "BIC", "params", "MFLOPs/img", "s/epoch", "ms/img b1", "ms/img b256",
              "timed on (runs)", "epochs to 90/95/99% val", "largest val fall, seed: points (epoch)"]
    rows = []
    for c in cells:
        acc = c["test_accuracy"]
        if acc is None:
            rows.append([c["label"], f"missing ({_count(c)})"] + ["–"] * (len(header) - 2))
            continue
        rows.append([
            c["label"],
            f"{_pct(acc['mean'])}{'' if acc['std'] is None else ' ± ' + _pct(acc['std'])} ({_count(c)})",
            _interval(acc), _pct((c.get("test_sampling_error") or {}).get("standard_error")),
            f"{_pct(acc['min'])}–{_pct(acc['max'])}", _mean(c["macro_f1"], 100, 2),
            _mean(c.get("nll_per_image"), digits=4), _mean(c.get("expected_calibration_error"), 100, 2),
            _mean(c["log_likelihood"]), _mean(c["aic"]), _mean(c["bic"]),
            _number(c["params"], 0), _number(None if c["flops_per_image"] is None else c["flops_per_image"] / 1e6, 2),
            *_timings(c), _epochs_to(c), fall_text(c),
        ])
    return table_lines(header, rows)


# === The report ===


def _by(cells, experiment, dataset=None):
    return [c for c in cells if c["experiment"] == experiment and (dataset is None or c["dataset"] == dataset)]


def _datasets(cells):
    return list(dict.fromkeys(c["dataset"] for c in cells))


def _is_main(cell):
    return is_main_variant(cell["variant"])


def main_table(aggregated):
    """The main table: one row per main variant, one column per dataset (accuracy text)."""
    cells = [c for c in _by(aggregated["cells"], "variants") if _is_main(c)]
    datasets = _datasets(cells)
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    index = {(c["dataset"], c["variant"]): c for c in cells}
    rows = [[v] + [accuracy_text(index[(d, v)]) if (d, v) in index else "not planned" for d in datasets] for v in variants]
    return table_lines(["variant"] + [f"{dataset_name(d)} test accuracy %, mean ± std [95% CI] (seeds)" for d in datasets], rows)


def gap_table(aggregated):
    cells = [c for c in _by(aggregated["cells"], "variants") if c["variant"] != BASELINE]
    datasets = _datasets(cells)
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    index = {(c["dataset"], c["variant"]): c for c in cells}
    header = ["variant"]
    for d in datasets:
        name = dataset_name(d)
        header += [f"{name}: Δ vs {BASELINE}", f"{name}: Δ vs softmax, same position", f"{name}: Δ vs same kernel, absolute"]
    rows = []
    for v in variants:
        row = [v]
        softmax, absolute = v.startswith("softmax-"), v.endswith("-absolute")
        for d in datasets:
            c = index.get((d, v))
            row += [
                "–" if c is None else test_text(c.get("gap_to_softmax")),
                _comparison(c, "gap_to_softmax_same_position", same=absolute, absent=softmax),
                _comparison(c, "gain_over_absolute", same=softmax, absent=absolute),
            ]
        rows.append(row)
    return table_lines(header, rows)


def _comparison(cell, key, same, absent):
    """A gap-table entry: "(the same)" when it repeats the Δ vs softmax-absolute column, "–" when it does not apply."""
    if cell is None or absent:
        return "–"
    return "(the same)" if same else test_text(cell.get(key))


SIDES = ("above 0", "below 0", "not separated", "no test yet")


def interval_side(gap):
    """The Holm-adjusted verdict of a paired difference: one of `SIDES`."""
    if not gap or gap.get("verdict") is None:
        return "no test yet"
    return gap["verdict"]


def verdict_lines(aggregated):
    """Per dataset, the linear-kernel rows sorted by their Holm-adjusted verdicts.

    Four questions: is there a gap to close (kernel-absolute vs softmax), does
    a relative position reach softmax (kernel-position vs softmax-absolute),
    does the position help the kernel at all (vs kernel-absolute), and does it
    close the gap (the interaction).
    """
    cells = [c for c in _by(aggregated["cells"], "variants") if _is_main(c) and not c["variant"].startswith("softmax-")]
    questions = (
        ("gap to close (kernel-absolute − softmax-absolute)", "gap_to_softmax", True),
        ("relative position − softmax-absolute", "gap_to_softmax", False),
        ("relative position − same kernel, absolute", "gain_over_absolute", False),
        ("gap closed: (kernel − softmax) at the position − (kernel − softmax) at absolute", "interaction", False),
    )
    lines = []
    for dataset in _datasets(cells):
        lines.append(f"- {dataset_name(dataset)}:")
        for title, key, absolute in questions:
            groups = {}
            for c in cells:
                if c["dataset"] == dataset and c["variant"].endswith("-absolute") == absolute:
                    groups.setdefault(interval_side(c.get(key)), []).append(c["variant"])
            found = "; ".join(f"{side}: {', '.join(groups[side])}" for side in SIDES if side in groups)
            lines.append(f"  - {title}: {found or 'no run yet'}.")
    return lines


def interaction_table(aggregated):
    """One row per linear kernel x relative position: the interaction on each dataset."""
    cells = [c for c in _by(aggregated["cells"], "variants") if _is_main(c) and "interaction" in c]
    datasets = _datasets(cells)
    index = {(c["dataset"], c["variant"]): c for c in cells}
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    rows = [[v] + [test_text(index[(d, v)]["interaction"]) if (d, v) in index else "–" for d in datasets] for v in variants]
    return table_lines(["variant"] + [f"{dataset_name(d)}: gap closed, points" for d in datasets], rows)


def family_line(aggregated):
    family = aggregated.get("family") or {}
    return (f"Verdicts are Holm-adjusted over the family of all {family.get('size', 0)} distinct paired comparisons of the "
            f"main table on every dataset (gap to softmax-absolute, to softmax at the same position, gain over the same "
            f"kernel at absolute positions, gap closed), at family-wise α = {family.get('alpha', 0.05):g}. MDE is the "
            f"smallest true difference a two-sided paired t-test at α = {family.get('alpha', 0.05):g} (before the "
            f"adjustment) finds with {round(100 * family.get('power', 0.8))}% power, given the seed-to-seed spread of "
            "these pairs: \"not separated\" says nothing about differences smaller than it." + detectable_text(family))


def detectable_text(family):
    """The sentence on what each planned seed count detects, in units of the pairs' spread ("" without any)."""
    detectable = family.get("detectable_in_sd") or {}
    if not detectable:
        return ""
    parts = [f"{n} pairs {mde:.2f}" for n, mde in sorted(detectable.items(), key=lambda item: int(item[0]))]
    return f" In units of the pairs' standard deviation, the plan's seed counts detect: {', '.join(parts)}."


def cost_text(cell, base):
    """Latency and training-time ratios of `cell` to `base`, from runs of one device and XLA setting only."""
    latency = timing_ratio(cell, base, "latency_ms_batch1")
    if latency is None:
        return "cost not comparable: no runs of both on one device with one XLA setting"
    text = f"latency ×{latency['ratio']:.2f}"
    seconds = timing_ratio(cell, base, "train_seconds_per_epoch")
    if seconds is not None:
        text += f", training time ×{seconds['ratio']:.2f}"
    runs = "{}+{}".format(*latency["runs"])
    return f"{text}; {runs} runs on {_group_text(latency['device'], latency['jit_compile'])}"


def answer_lines(aggregated):
    """Per dataset and linear kernel: the gap with absolute positions and with each relative one, and the cost."""
    cells = _by(aggregated["cells"], "variants")
    index = {(c["dataset"], c["variant"]): c for c in cells}
    lines = []
    for dataset in _datasets(cells):
        for kernel in ("favor", "relu"):
            parts = []
            base = index.get((dataset, f"{kernel}-absolute"))
            for position in POSITIONS:
                c = index.get((dataset, f"{kernel}-{position}"))
                if c is None:
                    continue
                if not c.get("gap_to_softmax") or "mean" not in c["gap_to_softmax"]:
                    parts.append(f"{position} missing")
                    continue
                text = f"{position} {gap_text(c['gap_to_softmax'])}"
                if position != "absolute" and base:
                    text += f" ({cost_text(c, base)} vs {kernel}-absolute)"
                parts.append(text)
            if parts:
                lines.append(f"- {dataset_name(dataset)}, {kernel}: " + "; ".join(parts) + ".")
    return lines


def ablation_lines(aggregated):
    lines = num_features_lines(aggregated)
    lines += normalization_lines(aggregated)
    for ablation in SETTING_ABLATIONS.values():
        lines += setting_lines(aggregated, ablation)
    cells = _by(aggregated["cells"], "init_from")
    if cells:
        scratch = {(c["dataset"], c["variant"]): c for c in _by(aggregated["cells"], "variants")}
        rows = [
            [dataset_name(c["dataset"]), c["variant"],
             accuracy_text(scratch[(c["dataset"], c["variant"])]) if (c["dataset"], c["variant"]) in scratch else "–",
             accuracy_text(c), test_text(c.get("gain_over_scratch"))]
            for c in cells
        ]
        lines += ["## Ablation: from scratch against starting from the trained softmax ViT", "",
                  f"`--init-from` copies every weight of the same seed's {BASELINE} best.keras whose name and shape "
                  "match (everything but the kernel's own state); same epochs and schedule as from scratch. The started "
                  "run has also had the softmax run's training, so its gain mixes what transfers with more steps. Δ: "
                  f"percentage points [{round(100 * aggregated['confidence'])}% CI], two-sided p, MDE; outside the Holm "
                  "family (it asks what transfers, not the question), so p is uncorrected.", ""]
        lines += table_lines(["dataset", "variant", "from scratch", "from softmax", "Δ (init − scratch, paired)"], rows) + [""]
    return lines


def grid_rows(index, rows, columns, text):
    """Table rows of an ablation: per (dataset, name) of `rows`, the dataset, the name, then `text(cell)` of
    `index[(dataset, name, *column)]` for each column (a tuple), "–" where that cell does not exist."""
    return [[dataset_name(dataset), name] + [text(index[key]) if (key := (dataset, name, *column)) in index else "–"
                                             for column in columns] for dataset, name in rows]


def num_features_lines(aggregated):
    """The rows at each number of random features m: accuracies, validation falls, the epsilon floor where measured
    and inference latency."""
    cells = _by(aggregated["cells"], "num_features")
    if not cells:
        return []
    values = sorted({c["setting"]["num_features"] for c in cells})
    index = {(c["dataset"], c["variant"], c["setting"]["num_features"]): c for c in cells}
    rows, columns = dict.fromkeys((c["dataset"], c["variant"]) for c in cells), [(m,) for m in values]

    def grid(text):
        return grid_rows(index, rows, columns, text)

    header = ["dataset", "variant"] + [f"m = {m}" for m in values]
    lines = ["## Ablation: number of random features m", "",
             "Test accuracy %, mean ± std [95% CI] (seeds); the profile's own m is the variant row above.", ""]
    lines += table_lines(header, grid(accuracy_text)) + [""]
    lines += ["Each seed's largest fall of validation accuracy below its best earlier epoch (seed: points, the epoch "
              "of the low in brackets): whether a collapse depends on the estimator's variance, which falls as 1/m.", ""]
    lines += table_lines(header, grid(fall_text)) + [""]
    floors = grid(floor_text)
    if any(text != "–" for row in floors for text in row[2:]):
        lines += [f"{FLOOR_WORDS[0].upper()}{FLOOR_WORDS[1:]}: whether a run that fell got its attention back.", ""]
        lines += table_lines(header, floors) + [""]
    # One table per device and XLA setting: latencies compare only within one, and a profile's row of its own m
    # may have run on another device than the ablation's other rows.
    for group in shared_timing_groups(cells):
        latency_rows = grid(lambda c: _number(group_mean(c, *group, "latency_ms_batch1"), 3))
        lines += [f"Inference ms per image (batch 1, runs on {_group_text(*group)} only):", ""]
        lines += table_lines(header, [row for row in latency_rows if set(row[2:]) != {"–"}]) + [""]
    keys = {"change_from_profile_m": "this m − the profile's", "gap_to_softmax_same_m": "gap to softmax"}
    lines += contrast_lines(aggregated, cells, keys, "m", lambda c: str(c["setting"]["num_features"]),
                            "a matter of the number of random features")
    return lines


def contrast_lines(aggregated, cells, keys, column, value_text, question):
    """An ablation's paired contrasts: per cell and each {key: words} of `keys` it has a test for, its dataset,
    variant, `value_text(cell)` under `column`, the words, the baseline and the test; none without a test."""
    rows = [[dataset_name(c["dataset"]), c["variant"], value_text(c), words, c[key]["baseline"], test_text(c[key])]
            for c in cells for key, words in keys.items() if (c.get(key) or {}).get("mean") is not None]
    if not rows:
        return []
    return [f"Paired contrasts, percentage points [{round(100 * aggregated['confidence'])}% CI], two-sided p, MDE; "
            f"outside the Holm family (they ask whether the gap is {question}), so each p is uncorrected:", "",
            *table_lines(["dataset", "variant", column, "contrast", "against", "difference"], rows), ""]


def setting_lines(aggregated, ablation):
    """The rows of a setting ablation (`setting_ablations`): accuracies beside the variant rows', then paired
    contrasts."""
    field, noun, at_profile = ablation.field, ablation.noun, ablation.profile_words()
    cells = _by(aggregated["cells"], field)
    if not cells:
        return []
    own = {(c["dataset"], c["variant"]): c for c in _by(aggregated["cells"], "variants")}
    values = {(c["config"] or {}).get(field, LATER_FIELDS.get(field)) for c in own.values() if c["config"]} - {None}
    own_text = " or ".join(ablation.text(v) for v in sorted(values)) or "the profile's"
    rows = []
    for c in cells:
        base = own.get((c["dataset"], c["variant"]))
        rows.append([dataset_name(c["dataset"]), c["variant"], accuracy_text(base) if base else "–",
                     ablation.text(c["setting"][field]), accuracy_text(c), fall_text(base) if base else "–",
                     fall_text(c), floor_text(c)])
    # The floor column only where some run of the ablation was measured (`experiments.favor_floor`).
    floors = any(row[-1] != "–" for row in rows)
    floor_words = f", and, {FLOOR_WORDS}" if floors else ""
    lines = [f"## Ablation: {ablation.heading}", "",
             f"{ablation.about.format(own=own_text)}. Test accuracy %, as in the main table (the profile's-{noun} column is "
             "the main table's row), and each seed's largest fall of validation accuracy below its best earlier epoch "
             f"(seed: points, the epoch of the low in brackets){floor_words}:", ""]
    this = f"{ablation.preposition} this {noun}"
    header = ["dataset", "variant", at_profile, noun, this, f"fall {at_profile}", f"fall {this}"]
    header, rows = (header + [f"on the floor {this}"], rows) if floors else (header, [row[:-1] for row in rows])
    lines += table_lines(header, rows) + [""]
    keys = {ablation.key("change_from_profile"): f"this {noun} − the profile's",
            ablation.key("gap_to_softmax_same"): "gap to softmax", ablation.key("gap_closed_by"): f"gap closed by the {noun}",
            ablation.key("interaction_same"): "gap closed by the position"}
    return lines + contrast_lines(aggregated, cells, keys, noun, lambda c: ablation.text(c["setting"][field]),
                                  f"the {ablation.name}'s")


def normalization_lines(aggregated):
    """The position x q/k normalisation 2 x 2: accuracies, validation falls, then its paired contrasts."""
    switched = _by(aggregated["cells"], "normalize_qk")
    if not switched:
        return []
    index = normalization_index(aggregated["cells"])
    positions = relative_positions(key for key, cell in index.items() if cell["experiment"] == "normalize_qk")
    columns = [("absolute", False), ("absolute", True)] + [(p, n) for p in positions for n in (True, False)]
    kernels = dict.fromkeys((c["dataset"], c["variant"].partition("-")[0]) for c in switched)

    def grid(text):
        return grid_rows(index, kernels, columns, text)

    norms = sorted({(c["config"] or {}).get("qk_norm", LATER_FIELDS["qk_norm"])
                    for (*_, normalized), c in index.items() if normalized and c["config"]})
    norm_text = " or ".join(f"{n:g} √d" for n in norms) or "the profile's qk_norm × √d"
    lines = ["## Ablation: the position against q/k normalisation", "",
             f"kerple rows normalise q and k (to norm {norm_text}), the other positions do not; these rows switch it, so the position's effect can be read at a fixed normalisation. Test "
             "accuracy %, as in the main table (the default-normalisation columns are the main table's rows):", ""]
    header = ["dataset", "kernel"] + [f"{p}, norm {'on' if n else 'off'}" for p, n in columns]
    lines += table_lines(header, grid(accuracy_text)) + [""]
    lines += ["Each seed's largest fall of validation accuracy below its best earlier epoch (seed: points, the epoch "
              "of the low in brackets): a collapse that the final accuracy hides when the run recovers.", ""]
    lines += table_lines(header, grid(fall_text)) + [""]
    contrasts = aggregated.get("normalization") or []
    if contrasts:
        lines += [f"Paired contrasts, percentage points [{round(100 * aggregated['confidence'])}% CI], two-sided p, MDE; "
                  "outside the Holm family (they separate the position from the normalisation; the main table is the "
                  "question), so each p is uncorrected:", ""]
        lines += table_lines(["dataset", "kernel", "contrast", "against", "difference"], [
            [dataset_name(c["dataset"]), c["kernel"], c["contrast"], c["baseline"], test_text(c)] for c in contrasts])
        lines.append("")
    return lines


# The parts of a queue (`aggregate.queue_part`) in the report's words; "main table" and "extra rows" read as they are.
PART_NAMES = {"more seeds": "seeds beyond the main table's", "init_from": "init-from ablation",
              "num_features": "num_features ablation", "normalize_qk": "q/k normalisation ablation",
              **{field: f"{ablation.name.replace(' ', '-')} ablation" for field, ablation in SETTING_ABLATIONS.items()}}


def progress_parts(aggregated):
    """{part of the queue: (finished, planned)} (`aggregate.queue_part`), in queue order."""
    parts = {}
    for c in aggregated["cells"]:
        for seed in c["seeds"]["planned"]:
            part = parts.setdefault(queue_part(c["experiment"], c["variant"], seed, aggregated["seeds"]), [0, 0])
            part[0] += seed in c["seeds"]["finished"]
            part[1] += 1
    return parts


def progress_text(parts):
    """["main table 36 of 72", "extra rows 0 of 42", ...] of `progress_parts`."""
    return [f"{PART_NAMES.get(name, name)} {done} of {planned}" for name, (done, planned) in parts.items()]


def missing_lines(aggregated):
    runs = aggregated["runs"]
    parts = progress_parts(aggregated)
    text = progress_text(parts)
    if "num_features" in parts:
        text.append("the num_features ablation counts the variant rows it shares")
    lines = [f"Runs finished: **{runs['finished']} of {runs['planned']}** ({'; '.join(text)})."]
    if runs["missing"]:
        by_cell = {}
        for folder in runs["missing"]:
            cell, _, seed = folder.rpartition("/")
            by_cell.setdefault(cell, []).append(seed[4:])
        lines += ["", "<details><summary>Still missing (cell: seeds)</summary>", ""]
        lines += [f"- `{cell}`: {', '.join(sorted(seeds, key=int))}" for cell, seeds in by_cell.items()]
        lines += ["", "</details>"]
    commits = aggregated.get("commits", [])
    if len(commits) > 1:
        lines += ["", f"**Code versions:** the finished runs were trained by {len(commits)} commits "
                      f"({', '.join(commit[:12] for commit in commits)}; each run's `provenance.json` says which "
                      "trained which epochs), so this table mixes code versions."]
    elif commits:
        lines += ["", f"Code version: every finished run was trained by commit {commits[0][:12]}."]
    xla = aggregated.get("xla_runs", 0)
    if xla:
        lines += ["", f"XLA: {xla} of the {aggregated['runs']['finished']} finished runs compiled their training "
                      "step with XLA (`jit_compile`). It changes float rounding, not what a step computes, so a "
                      "cell may hold runs with and without it (each run's config.json says which); it changes the "
                      "speed, so training times compare only between runs with the same setting and device."]
    mixed = [c["directory"] for c in aggregated["cells"] if c.get("mixed_config")]
    if mixed:
        lines += ["", f"**Warning:** runs of different settings share a cell (not comparable): {', '.join(mixed)}."]
    return lines


def part_text(dataset, part):
    """"<dataset> <part of the queue>: N runs, H hours" of a forecast's or a compute summary's part."""
    return (f"{dataset_name(dataset)} {PART_NAMES.get(part['part'], part['part'])}: {part['runs']} "
            f"run{'' if part['runs'] == 1 else 's'}, {part['hours']:.1f} hours")


def forecast_lines(forecast):
    """What the queued runs need, per part of the queue ([] when none is queued)."""
    if not forecast or not forecast["runs"]:
        return []
    parts = [part_text(part["dataset"], part) + (f" ({part['without_forecast']} without a forecast)"
                                                 if part["without_forecast"] else "")
             for part in forecast["parts"]]
    return [f"Forecast for the {forecast['runs']} queued runs: about {forecast['hours']:.1f} hours of training "
            f"epochs ({forecast['basis']}{elsewhere_text(forecast)}; `--list` gives each run's): {'; '.join(parts)}.", ""]


def compute_lines(aggregated):
    """The "Compute" section: hours of training epochs the finished runs took, per dataset and device."""
    compute = aggregated.get("compute") or {}
    if not compute:
        return []
    lines = ["## Compute", "", *forecast_lines(aggregated.get("forecast")),
             "Hours of training epochs of the finished runs, and minutes per run (min / median / max): the sum of "
             "each run's `history.csv` epoch_seconds over every session that trained it, so compilation, evaluation "
             "and checkpoints are not counted, and neither is an epoch a stop cut short. Grouped by device and XLA "
             "setting, which set the speed; runs beside other work on the same machine are slower.", "",
             "| dataset | device, XLA | runs | hours | minutes per run |", "|---|---|---|---|---|"]
    for dataset, summary in compute.items():
        for group in summary["groups"]:
            minutes = group["minutes"]
            lines.append(f"| {dataset_name(dataset)} | {_group_text(group['device'], group['jit_compile'])} | "
                         f"{group['runs']} | {group['hours']:.1f} | {minutes['min']:.0f} / {minutes['median']:.0f} / "
                         f"{minutes['max']:.0f} |")
        lines.append(f"| {dataset_name(dataset)} | all | {summary['runs']} | {summary['hours']:.1f} | |")
    total = sum(summary["hours"] for summary in compute.values())
    parts = [part_text(dataset, part) for dataset, summary in compute.items() for part in summary["parts"]]
    return lines + ["", f"All datasets: {sum(s['runs'] for s in compute.values())} runs, {total:.1f} hours of "
                        f"training epochs. Per part of the queue: {'; '.join(parts)}.", ""]


def _device_line(aggregated):
    devices = ", ".join(aggregated["devices"]) or "none yet"
    backends = ", ".join(aggregated["backends"]) or "none yet"
    return f"Device: {devices}; Keras backend: {backends}."


def render(aggregated, figures):
    """README.md text of `aggregated` with the `figures` {name: (drawn, note)}."""
    commands = aggregated["commands"]
    cells = aggregated["cells"]
    datasets = _datasets(cells)
    lines = [
        f"# Benchmark `{aggregated['profile']}`: softmax against Performer ViTs with relative positions", "",
        "Do relative positional encodings (RoPE, STRING, KERPLE) close the accuracy gap between a softmax ViT "
        "and Performer ViTs (FAVOR+, ReLU), and at what cost? Every number below is read from "
        "`aggregate.json`, which aggregates the run folders beside it; the commands remake them:", "",
        "```", commands["benchmark"], commands["report"], "```", "",
        _device_line(aggregated), "", *missing_lines(aggregated), "",
        "<details><summary>The profile</summary>", "", "```", aggregated["doc"], "```", "", "</details>", "",
        "## Main table", "",
        f"Test accuracy %; ± is the sample std over seeds (ddof 1), the interval the {round(100 * aggregated['confidence'])}% "
        "Student-t confidence interval of the mean (none with one seed); (finished/planned seeds).", "",
        *main_table(aggregated), "",
        "## Gap to softmax", "",
        f"Paired over the seeds both runs share (seed k of every variant sees the same data order): mean of "
        f"acc(variant) − acc(softmax), percentage points, [{round(100 * aggregated['confidence'])}% CI], pairs. "
        "Each entry: the mean difference, its interval, the two-sided paired t-test's p-value, the Holm-adjusted "
        "p-value and verdict, and the minimum detectable difference (MDE).", "",
        family_line(aggregated), "",
        "### The question itself: does the position close the gap?", "",
        "Gap closed = (kernel − softmax) at the relative position − (kernel − softmax) at absolute positions, "
        "paired over seeds; above 0 means the position narrows the kernel's gap to softmax. Percentage points, "
        f"[{round(100 * aggregated['confidence'])}% CI], two-sided p, Holm-adjusted p and verdict, MDE.", "",
        *interaction_table(aggregated), "",
        "Verdicts of the linear kernels (Holm):", "",
        *verdict_lines(aggregated), "",
        "Each gap, with the cost of the position:", "",
        *answer_lines(aggregated), "",
        *gap_table(aggregated), "",
    ]
    for dataset in datasets:
        rows = _by(cells, "variants", dataset)
        lines += [f"## {dataset_name(dataset)} in detail", "",
                  "Test SE: the binomial sampling error sqrt(a (1 − a) / n) of the mean accuracy on the n test images "
                  "(every seed is scored on the same images, so more seeds do not shrink it). NLL (mean negative "
                  "log-likelihood per test image, nats) and ECE (expected calibration error, 15 confidence bins) are "
                  "the fit measures to read: AIC and BIC are 2k − 2 ln L and k ln n − 2 ln L with k the trainable "
                  "parameters, tens of thousands here against − 2 ln L of a few thousand, so they rank the variants "
                  "by their parameter count. Params trainable; seconds per epoch (median epoch of a run) and ms per "
                  "image at batch 1 and 256: timings depend on the machine and on XLA, so each is the mean over the "
                  "cell's largest group of runs on one device with one XLA setting (named in \"timed on\"), and "
                  "they compare only between rows timed on the same; on a shared machine they are noisy, so read "
                  "small differences with care.", ""]
        lines += detail_table([c for c in rows if _is_main(c)]) + [""]
        extra = [c for c in rows if not _is_main(c)]
        if extra:
            lines += ["Extra rows (exp: deterministic exponential features; linformer: learned sequence projection):", ""]
            lines += detail_table(extra) + [""]
    lines += ablation_lines(aggregated)
    lines += compute_lines(aggregated)
    lines += ["## Figures", ""]
    for dataset in datasets:
        for name, title in (("pareto", "Accuracy against inference latency"),
                            ("curves", "Validation curves"), ("saliency", "Saliency maps")):
            drawn, note = figures.get(f"{name}_{dataset}", (False, "not drawn: no finished run"))
            lines += [f"**{title}, {dataset_name(dataset)}.** {note}", ""]
            if drawn:
                lines += [f"![{title}, {dataset_name(dataset)}]({name}_{dataset}.png)", ""]
    return "\n".join(lines).rstrip() + "\n"


def render_readme_section(reports):
    """The top-level README's results section, quoted from the reports.

    Args:
        reports: [(aggregated, path of its README.md relative to the top level)]
            of every profile with an aggregate.json. A profile with finished
            runs shows its main table and the gaps; one without shows a line
            saying what is missing and how to run it.
    """
    lines = ["## Results tables", ""]
    for aggregated, report_path in reports:
        settings = ", ".join(f"{k} {v}" for k, v in aggregated["settings"].items())
        epochs = ", ".join(f"{dataset_name(d)} {e}" for d, e in aggregated["epochs"].items())
        runs = aggregated["runs"]
        commands = aggregated["commands"]
        seeds = ", ".join(map(str, aggregated["seeds"]))
        ablation_seeds = aggregated.get("ablation_seeds", aggregated["seeds"])
        if ablation_seeds != aggregated["seeds"]:
            seeds = f"{seeds}; extra rows and ablations {', '.join(map(str, ablation_seeds))}"
        for dataset, more in aggregated.get("more_seeds", {}).items():
            seeds = f"{seeds}; {dataset_name(dataset)} also {', '.join(map(str, more))}, queued last"
        summary = (f"Profile `{aggregated['profile']}` ({settings}; epochs {epochs}; seeds {seeds}): "
                   f"{runs['finished']} of {runs['planned']} runs finished ({'; '.join(progress_text(progress_parts(aggregated)))}).")
        if aggregated.get("pipeline_check") and runs["finished"]:
            lines += [f"{summary} A pipeline check, not an answer: [its report]({report_path}) has the table and "
                      "what it can and cannot say.", ""]
            continue
        if not runs["finished"]:
            lines += [f"{summary} Nothing has run yet; [its report]({report_path}) lists every missing run. "
                      f"Run it with `{commands['benchmark']}`.", ""]
            continue
        lines += [
            f"{summary} {_device_line(aggregated)} The full report, with the gap to softmax and its intervals, "
            f"the ablations and the figures: [{report_path}]({report_path}). Remake it with "
            f"`{commands['benchmark']}` then `{commands['report']}`.", "",
            *main_table(aggregated), "",
            f"Δ test accuracy vs {BASELINE} in percentage points, paired over seeds, [95% CI]; cost relative to the "
            "kernel with absolute positions:", "",
            *answer_lines(aggregated), "",
            f"Verdicts of the linear kernels, Holm-adjusted over the {(aggregated.get('family') or {}).get('size', 0)} "
            "paired comparisons of the main table (not separated: these seeds cannot tell the two apart):", "",
            *verdict_lines(aggregated), "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def read_aggregate(path):
    """A profile's aggregate.json; ValueError in one line where it does not read or lacks what its row of
    README_SECTION.md needs (a hand edit, a damaged disk): the row is rendered to find out."""
    aggregated = atomic.read_json_object(path)
    try:
        render_readme_section([(aggregated, "README.md")])
    except atomic.MALFORMED as error:
        raise ValueError(f"{path} is not a benchmark's aggregate ({error!r})") from None
    return aggregated


def write_readme_section(results_dir, read=None):
    """README_SECTION.md in `results_dir` from every results/<profile>/aggregate.json there; `read` maps such a
    path to its aggregate where the caller has it already (main reads and checks them before writing anything)."""
    results_dir = Path(results_dir)
    read = read or {}
    reports = [
        (read[path] if path in read else atomic.read_json_object(path),
         os.path.relpath(path.parent / "README.md", results_dir.parent))
        for path in results_dir.glob("*/aggregate.json")
    ]
    order = list(PROFILES)
    # In the order of benchmark_profiles, the answer (cpu) first.
    reports.sort(key=lambda r: (order.index(r[0]["profile"]) if r[0]["profile"] in order else len(order), r[0]["profile"]))
    path = results_dir / "README_SECTION.md"
    atomic.write_text(path, render_readme_section(reports))
    return path


def _pareto(cells, dataset, root):
    """(drawn, note) of the accuracy-latency figure, whose latencies all come from one device and XLA setting."""
    finished = [c for c in cells if c["test_accuracy"]]
    group = common_timing_group(finished)
    points = [(c, group_mean(c, *group, "latency_ms_batch1")) for c in finished] if group else []
    points = [(c, latency) for c, latency in points if latency is not None]
    if not plot_pareto(points, dataset, root / f"pareto_{dataset}.png"):
        return False, "not drawn: no finished run"
    note = f"Marker: position; colour: kernel; bars: std over seeds. Latency: the runs on {_group_text(*group)}"
    left_out = [c["label"] for c in finished if c not in [cell for cell, _ in points]]
    if left_out:
        note += f"; left out, with no run timed there: {', '.join(left_out)}"
    return True, note + "."


def write_report(aggregated, root, results_dir=None, read=None):
    """Write README.md and the figures of `aggregated` into `root`; README_SECTION.md into `results_dir`
    (from every profile's aggregate.json there, taken from `read` where it holds one: `write_readme_section`).

    Returns: the README path.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    figures = {}
    rows = _by(aggregated["cells"], "variants")
    for dataset in _datasets(rows):
        in_dataset = _by(rows, "variants", dataset)
        figures[f"pareto_{dataset}"] = _pareto(in_dataset, dataset, root)
        drawn = plot_curves(in_dataset, dataset, root / f"curves_{dataset}.png")
        figures[f"curves_{dataset}"] = (drawn, "One panel per kernel, one line per position; the legend counts the seeds."
                                        if drawn else "not drawn: no finished run")
        drawn, note = plot_saliency([c for c in in_dataset if _is_main(c)], dataset, root, root / f"saliency_{dataset}.png")
        figures[f"saliency_{dataset}"] = (drawn, f"First {SALIENCY_IMAGES} test images, true class; method: {note}."
                                          if drawn else note + ".")
    for name, (drawn, _) in figures.items():
        if not drawn:
            # Left by an earlier report (from checkpoints since deleted, say), it would contradict this one.
            (root / f"{name}.png").unlink(missing_ok=True)
    readme = root / "README.md"
    atomic.write_text(readme, render(aggregated, figures))
    if results_dir is not None:
        write_readme_section(results_dir, read)
    return readme


def main(argv=None):
    args = parser("report", __doc__, *SELECTION_OPTIONS).parse_args(argv)
    try:
        profile = get_profile(args.profile)
        selected = selected_jobs(args, profile)
        root = profile_root(args.results_dir, profile)
        if not root.is_dir():
            # A mistyped --results-dir would otherwise get a new folder holding a report of no runs.
            raise RunError(f"{root} does not exist: no run of profile {profile.name!r} to report; "
                           f"run {commands(profile, args.results_dir)['benchmark']} first")
        others = {}  # the other profiles' README_SECTION.md rows
        for path in Path(args.results_dir).glob("*/aggregate.json"):
            try:
                if path.parent != root:
                    others[path] = read_aggregate(path)
            except ValueError as error:  # a hand edit or a damaged disk: refused before anything is written
                raise RunError(f"{error}; `python -m experiments.report --profile {path.parent.name}` writes it "
                               "again") from None
    except (RunError, ValueError) as error:
        return fail("report", error)
    start_backend("report")
    # Through JSON, as aggregate.json holds it (tuples become lists), without reading the file back.
    aggregated = json.loads(json.dumps(write_aggregate(profile, args.results_dir, selected)))
    readme = write_report(aggregated, root, args.results_dir, {**others, root / "aggregate.json": aggregated})
    print(f"report: {readme} ({aggregated['runs']['finished']} of {aggregated['runs']['planned']} runs finished)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
