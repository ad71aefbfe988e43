"""The benchmark: queue, kill and resume, aggregate statistics by hand, report.

The end-to-end test runs the `tiny` profile (softmax-absolute and
favor-absolute, seeds 0 and 1, 300 MNIST examples, 1 epoch) as a real
subprocess, kills it with SIGKILL once the first run has its metrics.json,
resumes it in the test process, and checks aggregate.json against numbers
computed here from the run folders. The other tests need no training.
"""

import csv
import dataclasses
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from experiments import aggregate, benchmark, forecast, report
from experiments.benchmark_profiles import get_profile
from experiments.evaluation import METRIC_KEYS
from experiments.models import EvaluationError
from experiments.run_config import RunConfig, RunError

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
# Student t quantiles t_{0.975, df}, from a printed table.
T975 = {1: 12.706204736174707, 2: 4.302652729911275}


def hand_summary(values):
    """mean, sample std and the 95% interval, the way a reader checks them."""
    mean = sum(values) / len(values)
    std = statistics.stdev(values)
    half = T975[len(values) - 1] * std / math.sqrt(len(values))
    return mean, std, (mean - half, mean + half)


def assert_summary(summary, values):
    mean, std, (low, high) = hand_summary(values)
    assert summary["n"] == len(values)
    assert summary["mean"] == pytest.approx(mean, abs=1e-12)
    assert summary["std"] == pytest.approx(std, abs=1e-12)
    assert summary["ci95"] == pytest.approx([low, high], abs=1e-9)
    assert (summary["min"], summary["max"]) == (min(values), max(values))


# === Statistics ===


def test_summarize_against_hand_numbers():
    assert_summary(aggregate.summarize([0.80, 0.90, 0.85]), [0.80, 0.90, 0.85])
    # 0.85 +- 4.3027 * 0.05 / sqrt(3)
    assert aggregate.summarize([0.80, 0.90, 0.85])["ci95"] == pytest.approx([0.72579, 0.97421], abs=1e-5)
    one = aggregate.summarize([0.7, None])
    assert (one["n"], one["mean"], one["std"], one["ci95"]) == (1, 0.7, None, None)
    assert aggregate.summarize([None]) is None


def test_paired_difference_uses_common_seeds_only():
    gap = aggregate.paired_difference({0: 0.80, 1: 0.70, 2: 0.75}, {0: 0.85, 1: 0.80, 5: 0.1})
    assert gap["seeds"] == [0, 1]
    assert_summary({k: v for k, v in gap.items() if k != "seeds"}, [0.80 - 0.85, 0.70 - 0.80])
    assert aggregate.paired_difference({0: 0.8}, {1: 0.8}) is None


def test_comparisons_and_their_holm_verdicts():
    def cell(variant, values):
        per_seed = {str(seed): {"test_accuracy": v} for seed, v in enumerate(values)}
        return {"experiment": "variants", "dataset": "mnist", "variant": variant, "per_seed": per_seed}

    softmax = [0.90, 0.92, 0.91]
    favor_absolute = [0.80, 0.83, 0.81]  # below softmax on every seed by 0.10, 0.09, 0.10
    favor_rope = [0.91, 0.92, 0.93]  # +0.01, 0.00, +0.02 against softmax
    cells = [cell("softmax-absolute", softmax), cell("favor-absolute", favor_absolute), cell("favor-rope", favor_rope)]
    aggregate.add_comparisons(cells)
    favor, rope = cells[1], cells[2]
    assert_summary({k: v for k, v in favor["gap_to_softmax"].items() if k not in ("seeds", "baseline")},
                   [a - b for a, b in zip(favor_absolute, softmax)])
    assert_summary({k: v for k, v in rope["gain_over_absolute"].items() if k not in ("seeds", "baseline")},
                   [a - b for a, b in zip(favor_rope, favor_absolute)])
    assert rope["gain_over_absolute"]["baseline"] == "favor-absolute"
    assert "gain_over_absolute" not in favor
    # By hand (n = 3, t on 2 df, two-sided p = 1 - t / sqrt(t^2 + 2)):
    # favor-absolute - softmax: -0.10, -0.09, -0.10: mean -0.09667, std 0.00577, t = -29.0, p = 0.00119;
    # favor-rope - softmax: 0.01, 0.00, 0.02: t = 1.732, p = 0.2254;
    # favor-rope - favor-absolute: 0.11, 0.09, 0.12: mean 0.10667, std 0.01528, t = 12.095, p = 0.00677;
    # favor-rope - softmax-rope: no softmax-rope row, so no test; no interaction either.
    # Holm over these 3: 3 x 0.00119 = 0.00357, 2 x 0.00677 = 0.01354, 1 x 0.2254.
    assert aggregate.adjust_family(cells) == 3
    assert favor["gap_to_softmax"]["p_holm"] == pytest.approx(3 * (1 - 29 / math.sqrt(29**2 + 2)), rel=1e-3)
    assert report.interval_side(favor["gap_to_softmax"]) == "below 0"
    assert report.interval_side(rope["gap_to_softmax"]) == "not separated"
    assert report.interval_side(rope["gain_over_absolute"]) == "above 0"
    assert report.interval_side({"mean": 0.1, "ci95": None}) == "no test yet"
    lines = report.verdict_lines({"cells": cells})
    assert lines == [
        "- MNIST:",
        "  - gap to close (kernel-absolute − softmax-absolute): below 0: favor-absolute.",
        "  - relative position − softmax-absolute: not separated: favor-rope.",
        "  - relative position − same kernel, absolute: above 0: favor-rope.",
        "  - gap closed: (kernel − softmax) at the position − (kernel − softmax) at absolute: no test yet: favor-rope.",
    ]


# === The queue ===


def test_small_profile_queue_order_and_shared_runs(tmp_path):
    profile = get_profile("small")
    jobs = benchmark.plan(profile, tmp_path)
    rows = [j for j in jobs if j.experiment == "variants"]
    # the main table (12 variants, 5 seeds), then the exp/linformer rows (7, 3 seeds); 2 datasets each
    assert len(rows) == 12 * 2 * 5 + 7 * 2 * 3
    # the main table first: all MNIST rows, then CIFAR-10, every seed of a row before the next row
    main = rows[:120]
    assert {j.variant for j in main} == set(profile.variants)
    assert [j.dataset for j in main] == ["mnist"] * 60 + ["cifar10"] * 60
    assert [(j.variant, j.seed) for j in rows[:6]] == [("softmax-absolute", s) for s in range(5)] + [("softmax-rope", 0)]
    assert {j.seed for j in rows[120:]} == {0, 1, 2}
    assert jobs.index(rows[-1]) < min(jobs.index(j) for j in jobs if j.experiment != "variants")
    # m = the profile's m is the variant row's own folder with the row's seeds, not a second run
    ablation = [j for j in jobs if j.experiment == "num_features"]
    shared = [j for j in ablation if j.config.num_features == 16]
    assert shared and all(j.cell == f"runs/{j.dataset}/{j.variant}" for j in shared)
    assert sorted({j.seed for j in shared}) == [0, 1, 2, 3, 4]
    assert {j.seed for j in ablation if j not in shared} == {0, 1, 2}
    unique = benchmark.unique_runs(jobs, tmp_path)
    assert len(unique) == len(jobs) - len(shared) == 120 + 42 + 18 + 48
    init = [j for j in jobs if j.experiment == "init_from"]
    assert {j.variant for j in init} == {"favor-absolute", "relu-absolute", "linformer-absolute"}
    assert {j.seed for j in init} == {0, 1, 2}
    assert all(j.config.init_from == str(j.needs) and f"softmax-absolute/seed{j.seed}/best.keras" in str(j.needs)
               for j in init)
    narrowed = benchmark.plan(profile, tmp_path, variants=["favor-rope"], datasets=["mnist"], seeds=[7], epochs=1)
    assert [(j.variant, j.dataset, j.seed, j.config.epochs) for j in narrowed] == [("favor-rope", "mnist", 7, 1)]


def test_more_seeds_run_after_the_whole_queue_and_join_their_rows(tmp_path):
    profile = get_profile("cpu")
    assert profile.more_seeds == {"cifar10": (3, 4)}
    jobs = benchmark.plan(profile, tmp_path)
    unique = benchmark.unique_runs(jobs, tmp_path)
    first, later = unique[:102], unique[102:]
    # The 102 runs planned before the further seeds keep their order: the queue resumes where it stood.
    assert [(j.experiment, j.cell, j.seed) for j in first] == [
        (j.experiment, j.cell, j.seed)
        for j in benchmark.plan(dataclasses.replace(profile, more_seeds={}), tmp_path)]
    assert [(j.experiment, j.dataset, j.variant, j.seed) for j in later] == [
        ("variants", "cifar10", variant, seed) for variant in profile.variants for seed in (3, 4)]
    assert all(j.config == profile.config(j.variant, "cifar10", j.seed) for j in later)
    rows = {(c["dataset"], c["label"]): c for c in benchmark.cells(jobs) if c["experiment"] == "variants"}
    assert rows[("cifar10", "favor-rope")]["seeds"] == [0, 1, 2, 3, 4]
    assert rows[("mnist", "favor-rope")]["seeds"] == [0, 1, 2]
    # --seeds replaces every seed of the queue, these too; a narrowed queue keeps its rows' further seeds.
    assert {j.seed for j in benchmark.plan(profile, tmp_path, seeds=[7])} == {7}
    narrowed = benchmark.plan(profile, tmp_path, variants=["relu-kerple"], experiments=["variants"])
    assert [(j.dataset, j.seed) for j in narrowed] == [("cifar10", s) for s in range(3)] + [
        ("mnist", s) for s in range(3)] + [("cifar10", 3), ("cifar10", 4)]
    header = benchmark.report_header(profile, tmp_path)
    assert header["more_seeds"] == {"cifar10": [3, 4]}
    # Nothing finished: every run is queued without a forecast, and the further seeds are a part of their own.
    assert [(part["dataset"], part["part"], part["runs"], part["without_forecast"])
            for part in header["forecast"]["parts"]] == [
        ("cifar10", "main table", 36, 36), ("mnist", "main table", 36, 36), ("cifar10", "normalize_qk", 12, 12),
        ("cifar10", "stabilizer", 9, 9), ("mnist", "stabilizer", 9, 9), ("cifar10", "more seeds", 24, 24)]
    result = aggregate.aggregate(benchmark.profile_root(tmp_path, profile), benchmark.cells(jobs), **header)
    assert report.progress_text(report.progress_parts(result)) == [
        "main table 0 of 72", "seeds beyond the main table's 0 of 24", "q/k normalisation ablation 0 of 12",
        "stabiliser ablation 0 of 18"]
    assert report.missing_lines(result)[0] == ("Runs finished: **0 of 126** (main table 0 of 72; seeds beyond the "
                                               "main table's 0 of 24; q/k normalisation ablation 0 of 12; "
                                               "stabiliser ablation 0 of 18).")
    small = get_profile("small")
    small_result = aggregate.aggregate(benchmark.profile_root(tmp_path, small),
                                       benchmark.cells(benchmark.plan(small, tmp_path)),
                                       **benchmark.report_header(small, tmp_path))
    assert report.missing_lines(small_result)[0] == (
        "Runs finished: **0 of 228** (main table 0 of 120; extra rows 0 of 42; init-from ablation 0 of 18; "
        "num_features ablation 0 of 68; the num_features ablation counts the variant rows it shares).")
    section = report.render_readme_section([({**header, "runs": {"planned": 108, "finished": 0, "missing": []},
                                        "cells": []}, "cpu/README.md")])
    assert "seeds 0, 1, 2; CIFAR-10 also 3, 4, queued last" in section


def test_tuned_profile_takes_searched_hyperparameters_only(tmp_path):
    profile = dataclasses.replace(get_profile("tuned"), hparams_dir=str(tmp_path))
    best = tmp_path / "mnist" / "favor-rope" / "best_hparams.json"
    best.parent.mkdir(parents=True)
    tuned_run = profile.config("favor-rope", "mnist", 0).to_dict() | {"learning_rate": 3e-4, "limit": 500, "seed": 9}
    best.write_text(json.dumps({"hyperparameters": tuned_run, "searched": ["learning_rate"]}))
    config = profile.config("favor-rope", "mnist", 1)
    assert (config.learning_rate, config.limit, config.seed, config.size) == (3e-4, None, 1, "reference")
    assert profile.config("relu-rope", "mnist", 1).learning_rate == 1e-3
    with pytest.raises(RunError, match="Unknown profile 'huge'"):
        get_profile("huge")


def test_tuned_profile_reads_the_committed_searches(monkeypatch):
    monkeypatch.chdir(REPO)  # hparams_dir is relative, as for a user in a checkout
    profile = get_profile("tuned")
    for variant in ("softmax-absolute", "favor-absolute", "relu-absolute"):
        best = json.loads((REPO / "tuning_results" / "mnist" / variant / "best_hparams.json").read_text())
        assert best["confirmation"]["seeds"] == [42, 43, 44]  # the search's seed and 2 more
        config = profile.config(variant, "mnist", 0)
        for name in best["searched"]:
            assert getattr(config, name) == best["hyperparameters"][name]
        # The search ran at the cpu size on 20,000 images; the tuned profile keeps its own size and data.
        assert (config.size, config.limit, config.heads) == ("reference", None, None)


def test_no_benchmark_profile_limits_the_test_split():
    from experiments.benchmark_profiles import PROFILES, Profile
    from experiments.data import load_dataset

    for name in PROFILES:
        profile = get_profile(name)
        for dataset in profile.datasets:
            config = profile.config(profile.variants[0], dataset, 0)
            assert config.limit is None or config.limit_test is False, (name, dataset)
    splits = load_dataset("mnist", limit=300, limit_test=False)
    assert (len(splits.train[0]), len(splits.validation[0]), len(splits.test[0])) == (300, 300, 10_000)
    with pytest.raises(ValueError, match="limits the test split"):
        Profile(name="x", doc="", variants=("softmax-absolute",), extra_variants=(), datasets=("mnist",),
                seeds=(0,), epochs={"mnist": 1}, settings=dict(limit=100))


def test_every_profile_trains_the_performer_s_favor_though_the_library_default_is_the_exponent():
    # Every committed favor row ran with the Performer's stabiliser; the library's default changed after them.
    from experiments.benchmark_profiles import PROFILES

    assert RunConfig().stabilizer == "exponent"
    for name in PROFILES:
        profile = get_profile(name)
        for dataset in profile.datasets:
            assert profile.config("favor-absolute", dataset, 0).stabilizer == "logits", (name, dataset)


# === Aggregate and report of planned, partly finished runs (no training) ===


def fake_run(folder, config, accuracy, val_curve, test_examples=None, device="cpu: test", latency=None):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    metrics = {key: None for key in METRIC_KEYS} | {
        "variant": config.variant, "dataset": config.dataset, "seed": config.seed, "test_accuracy": accuracy,
        "macro_f1": accuracy - 0.01, "log_likelihood": -100.0, "aic": 300.0, "bic": 400.0, "params": 1000,
        "flops_per_image": 2e6, "train_seconds_per_epoch": 5.0 * (latency or 1.0),
        "latency_ms_batch1": latency or 1.0 + accuracy, "latency_ms_batch256": 0.1,
        "epochs_to_90": 2 if max(val_curve) >= 0.9 else None, "device": device, "backend": "tensorflow", "test_examples": test_examples,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    with open(folder / "history.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "accuracy", "val_accuracy", "epoch_seconds"])
        writer.writerows([epoch, v, v, metrics["train_seconds_per_epoch"]] for epoch, v in enumerate(val_curve))


def two_finished_seeds(tmp_path):
    """(jobs, root, a function that aggregates their report cell) of softmax-absolute on MNIST, seeds 0 and 1, both finished."""
    profile = get_profile("small")
    jobs = benchmark.plan(profile, tmp_path, variants=["softmax-absolute"], datasets=["mnist"], seeds=[0, 1],
                          experiments=("variants",))
    root = benchmark.profile_root(tmp_path, profile)
    for job in jobs:
        fake_run(job.folder(root), job.config, 0.9, [0.5, 0.9])
    return jobs, root, lambda: aggregate.aggregate(root, benchmark.cells(jobs),
                                                   **benchmark.report_header(profile, tmp_path))["cells"][0]


def test_a_run_with_a_damaged_metrics_json_is_queued_again_and_missing_from_the_report(tmp_path):
    # The queue took it for finished (metrics.json existed) while the report counted it missing, so it never ran.
    jobs, root, cell = two_finished_seeds(tmp_path)
    (jobs[1].folder(root) / "metrics.json").write_text('{"test_accuracy": 0.9')
    assert [benchmark.is_finished(job, root) for job in jobs] == [True, False]
    assert benchmark.read_metrics(jobs[1].folder(root)) is None  # so no forecast reads a device from it
    assert cell()["seeds"]["finished"] == [0] and cell()["seeds"]["missing"] == [1]


@pytest.mark.parametrize("row", ["x,1,2,3", "2,0.9,0.9,abc"])
def test_a_config_provenance_or_history_damaged_by_hand_does_not_stop_the_report(tmp_path, row):
    # A list in config.json or provenance.json, or a history row that does not read, ended the report in a
    # traceback ('list' object has no attribute 'get'; list indices; invalid literal for int(); could not convert
    # string to float, from an epoch_seconds cell).
    jobs, root, cell = two_finished_seeds(tmp_path)
    (jobs[0].folder(root) / "provenance.json").write_text("[1]")
    with open(jobs[0].folder(root) / "history.csv", "a") as f:
        f.write(row + "\n")
    (jobs[1].folder(root) / "config.json").write_text("[1]")
    result = cell()
    assert result["seeds"]["finished"] == [0] and result["seeds"]["missing"] == [1]
    assert aggregate.read_sessions(jobs[0].folder(root)) == []
    # Its test metrics stand; its curve, fall and time are named as damaged, not read from the rows that do.
    damaged = result["per_seed"]["0"]["val_fall"]["damaged"]
    assert damaged == f"{jobs[0].folder(root) / 'history.csv'}, line 4, is no epoch's row"
    assert result["test_accuracy"]["mean"] == 0.9 and result["epoch_minutes"] == {} and result["val_fall"] is None
    assert report.fall_text(result) == f"0: {damaged}"


def test_ablations_gaps_and_missing_runs_reach_the_report(tmp_path):
    profile = get_profile("small")
    jobs = benchmark.plan(profile, tmp_path, variants=["softmax-absolute", "favor-absolute"], datasets=["mnist"], seeds=[0, 1])
    root = benchmark.profile_root(tmp_path, profile)
    accuracy = {}
    for job in benchmark.unique_runs(jobs, root):
        if (job.experiment, job.seed, job.config.num_features) == ("num_features", 1, 256):
            continue  # left unfinished
        value = {"softmax-absolute": 0.90, "favor-absolute": 0.85}[job.variant] + 0.02 * job.seed
        value += 0.03 * (job.experiment == "init_from") + job.config.num_features / 10_000
        accuracy[job.folder(root)] = value
        collapses = (job.experiment, job.seed, job.config.num_features) == ("num_features", 0, 32)
        fake_run(job.folder(root), job.config, value, [0.6, 0.2, value] if collapses else [0.5, value])

    result = aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path))
    cells = {(c["experiment"], c["label"]): c for c in result["cells"]}
    favor = cells[("variants", "favor-absolute")]
    values = [accuracy[root / "runs/mnist/favor-absolute" / f"seed{s}"] for s in (0, 1)]
    assert_summary(favor["test_accuracy"], values)
    softmax = [accuracy[root / "runs/mnist/softmax-absolute" / f"seed{s}"] for s in (0, 1)]
    assert favor["gap_to_softmax"]["mean"] == pytest.approx(statistics.mean(values) - statistics.mean(softmax))
    init = cells[("init_from", "favor-absolute")]
    assert init["gain_over_scratch"]["mean"] == pytest.approx(0.03)
    assert cells[("num_features", "favor-absolute-m16")]["per_seed"] == favor["per_seed"]
    assert cells[("num_features", "favor-absolute-m256")]["seeds"]["missing"] == [1]
    assert result["runs"]["missing"] == ["ablations/num_features/mnist/favor-absolute-m256/seed1"]
    # m = 16 is the row itself: nothing to compare. By hand, per seed: m = 32 is the row + 16/10,000, and
    # favor - softmax (at the profile's m, 16) is -0.05 + 16/10,000; m = 256 is paired over seed 0 alone.
    assert "change_from_profile_m" not in cells[("num_features", "favor-absolute-m16")]
    m32, m256 = cells[("num_features", "favor-absolute-m32")], cells[("num_features", "favor-absolute-m256")]
    assert m32["change_from_profile_m"]["mean"] == pytest.approx(0.0016)
    assert m32["change_from_profile_m"]["seeds"] == [0, 1]
    assert m32["change_from_profile_m"]["baseline"] == "favor-absolute at the profile's m"
    assert m32["gap_to_softmax_same_m"]["mean"] == pytest.approx(-0.0484)
    assert m32["gap_to_softmax_same_m"]["baseline"] == "softmax-absolute"
    assert m256["change_from_profile_m"]["seeds"] == [0] and m256["change_from_profile_m"]["mean"] == pytest.approx(0.024)
    assert all("p_holm" not in (c.get(key) or {}) for c in result["cells"]
               for key in ("change_from_profile_m", "gap_to_softmax_same_m"))
    assert favor["val_accuracy_curve"]["mean"] == pytest.approx([0.5, statistics.mean(values)])

    (root / "aggregate.json").write_text(json.dumps(result))
    (root / "saliency_mnist.png").write_bytes(b"a figure an earlier report drew from checkpoints now gone")
    readme = report.write_report(json.loads((root / "aggregate.json").read_text()), root, tmp_path).read_text()
    assert "## Ablation: number of random features m" in readme
    # Its falls, m = 16 being the main row's runs: only seed 0 at m = 32 fell (60% -> 20% in its second epoch).
    assert "| MNIST | favor-absolute | 0: 0.00 (1), 1: 0.00 (1) | 0: 40.00 (2), 1: 0.00 (1) |" in readme
    assert "| MNIST | favor-absolute | 32 | this m − the profile's | favor-absolute at the profile's m | +0.16 [" in readme
    assert "| MNIST | favor-absolute | 256 | gap to softmax | softmax-absolute | -2.60 (one pair: no interval, no test) |" in readme
    assert "| MNIST | favor-absolute | 16 |" not in readme
    assert "epsilon floor" not in readme  # no run has a favor_floor.json: no table of it
    # With one in m = 32's seed 0 (`experiments.favor_floor`), the table of the floor: its largest share, that seed only.
    (root / "ablations/num_features/mnist/favor-absolute-m32/seed0/favor_floor.json").write_text(json.dumps(
        {"checkpoints": [{"epoch": 2, "layers": [{"layer": "block_0_attention", "floor_mass": 0.75}]}]}))
    floored = report.render(aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path)), {})
    assert "the largest share of one block's attention on FAVOR+'s epsilon floor" in floored
    assert "| MNIST | favor-absolute | – | 0: 0.750 (block 0, epoch 2) | – |" in floored
    assert "## Ablation: from scratch against starting from the trained softmax ViT" in readme
    # init-from adds 0.03 to every seed: the paired test has no spread, so p is 0 and the MDE 0.
    assert "| +3.00 [3.00, 3.00], p 0.0e+00; MDE 0.00 |" in readme
    assert "favor-absolute-m256/seed1" not in readme and "`ablations/num_features/mnist/favor-absolute-m256`: 1" in readme
    assert f"{100 * statistics.mean(values):.2f}" in readme
    assert "no best.keras checkpoint" in readme and not (root / "saliency_mnist.png").exists()
    assert (root / "pareto_mnist.png").is_file() and (root / "curves_mnist.png").is_file()
    assert "small/README.md)" in (tmp_path / "README_SECTION.md").read_text()


def test_the_report_reads_each_aggregate_once(tmp_path, monkeypatch):
    # The committed profiles' aggregates beside a profile with no run yet, whose report adds its row.
    for name in ("cpu", "reference", "small"):
        (tmp_path / name).mkdir()
        shutil.copy(REPO / "results" / name / "aggregate.json", tmp_path / name)
    (tmp_path / "tiny").mkdir()
    reads = []
    read_json_object = report.atomic.read_json_object
    monkeypatch.setattr(report.atomic, "read_json_object", lambda path: reads.append(path) or read_json_object(path))
    assert report.main(["--profile", "tiny", "--results-dir", str(tmp_path)]) == 0
    aggregates = sorted(Path(path) for path in reads if Path(path).name == "aggregate.json")
    assert aggregates == sorted(tmp_path / name / "aggregate.json" for name in ("cpu", "reference", "small"))
    # The aggregates it had in hand make the section that reading them all from disk makes.
    section = (tmp_path / "README_SECTION.md").read_text()
    assert report.write_readme_section(tmp_path).read_text() == section and "tiny/README.md)" in section


def test_xla_is_not_a_different_setting_but_the_report_counts_it(tmp_path):
    profile = get_profile("tiny")
    jobs = benchmark.plan(profile, tmp_path, seeds=[0, 1])
    root = benchmark.profile_root(tmp_path, profile)
    for job in benchmark.unique_runs(jobs, root):
        config = dataclasses.replace(job.config, jit_compile=True) if job.seed == 1 else job.config
        fake_run(job.folder(root), config, 0.5 + 0.1 * job.seed, [0.3, 0.5])
    (root / "runs/mnist/favor-absolute/seed0/config.json").write_text(
        json.dumps(dataclasses.replace(jobs[0].config, variant="favor-absolute", num_features=9).to_dict()))

    result = aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path))
    cells = {c["label"]: c for c in result["cells"]}
    assert cells["softmax-absolute"]["mixed_config"] == []
    assert cells["softmax-absolute"]["jit_compile"] == {"0": False, "1": True}
    assert cells["favor-absolute"]["mixed_config"] == ["num_features"]  # a real difference is still flagged
    assert result["xla_runs"] == 2
    readme = report.write_report(result, root, tmp_path).read_text()
    assert "XLA: 2 of the 4 finished runs compiled their training step with XLA (`jit_compile`)." in readme
    assert "runs of different settings share a cell (not comparable): runs/mnist/favor-absolute." in readme


def test_timings_compare_only_between_runs_of_one_device_and_xla_setting(tmp_path):
    # variant -> per seed (device, XLA, ms per image); the naive mean over favor-absolute's seeds would be 4.
    timings = {
        "favor-absolute": [("cpu: A", False, 1.0), ("cpu: A", False, 1.0), ("cpu: B", True, 10.0)],
        "favor-rope": [("cpu: B", True, 30.0)] * 3,
        "relu-absolute": [("cpu: A", False, 2.0)] * 3,
        "relu-rope": [("cpu: B", True, 3.0)] * 3,
    }
    profile = get_profile("cpu")
    variants = ["softmax-absolute", "softmax-rope", *timings]
    jobs = benchmark.plan(profile, tmp_path, variants=variants, datasets=["mnist"], seeds=[0, 1, 2],
                          experiments=["variants"])
    root = benchmark.profile_root(tmp_path, profile)
    for job in benchmark.unique_runs(jobs, root):
        device, jit, latency = timings.get(job.variant, [("cpu: A", False, 1.0)] * 3)[job.seed]
        config = dataclasses.replace(job.config, jit_compile=jit)
        fake_run(job.folder(root), config, 0.9 + 0.01 * job.seed, [0.9], device=device, latency=latency)

    result = aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path))
    cells = {c["label"]: c for c in result["cells"]}
    assert cells["favor-absolute"]["timed_on"] == [{"device": "cpu: A", "jit_compile": False, "seeds": [0, 1]},
                                                   {"device": "cpu: B", "jit_compile": True, "seeds": [2]}]
    ratio = aggregate.timing_ratio(cells["favor-rope"], cells["favor-absolute"], "latency_ms_batch1")
    assert ratio == {"ratio": 3.0, "device": "cpu: B", "jit_compile": True, "runs": [3, 1]}
    assert aggregate.timing_ratio(cells["relu-rope"], cells["relu-absolute"], "latency_ms_batch1") is None
    readme = report.write_report(result, root, tmp_path).read_text()
    assert "(latency ×3.00, training time ×3.00; 3+1 runs on cpu: B, XLA vs favor-absolute)" in readme
    assert "(cost not comparable: no runs of both on one device with one XLA setting vs relu-absolute)" in readme
    assert "| 5.0 | 1.000 | 0.100 | cpu: A, no XLA (2/3) |" in readme  # favor-absolute, without seed 2's 10 ms
    assert ("Latency: the runs on cpu: A, no XLA; left out, with no run timed there: favor-rope, relu-rope."
            in readme)
    # One epoch each of 5 s x latency: on A, 8 runs of 5 s and relu-absolute's 3 of 10 s; on B, favor-absolute
    # seed 2's 50 s, favor-rope's 3 of 150 s and relu-rope's 3 of 15 s.
    compute = result["compute"]["mnist"]
    assert (compute["runs"], compute["hours"]) == (18, pytest.approx((70 + 545) / 3600))
    assert compute["groups"] == [
        {"device": "cpu: A", "jit_compile": False, "runs": 11, "hours": pytest.approx(70 / 3600),
         "minutes": {"min": pytest.approx(5 / 60), "median": pytest.approx(5 / 60), "max": pytest.approx(10 / 60)}},
        {"device": "cpu: B", "jit_compile": True, "runs": 7, "hours": pytest.approx(545 / 3600),
         "minutes": {"min": pytest.approx(15 / 60), "median": pytest.approx(50 / 60), "max": pytest.approx(2.5)}},
    ]
    assert "| MNIST | cpu: B, XLA | 7 | 0.2 | 0 / 1 / 2 |" in readme
    assert "All datasets: 18 runs, 0.2 hours of training epochs." in readme


def test_the_num_features_ablation_has_a_latency_table_per_device(tmp_path):
    # The reference profile's own-m row ran on a GPU, its other m on a CPU: one table each, never one device's
    # figures beside another's, and neither device's table dropped (it showed the device of the most cells alone).
    profile = get_profile("small")  # its own m is 16: favor-absolute-m16 is the main row's runs
    jobs = benchmark.plan(profile, tmp_path, variants=["softmax-absolute", "favor-absolute"], datasets=["mnist"],
                          seeds=[0], experiments=("variants", "num_features"))
    root = benchmark.profile_root(tmp_path, profile)
    for job in benchmark.unique_runs(jobs, root):
        m = job.config.num_features
        on_gpu = job.experiment == "variants"
        fake_run(job.folder(root), job.config, 0.9, [0.9], device="gpu: G" if on_gpu else "cpu: A",
                 latency=0.5 if on_gpu else m / 16)
    result = aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path))
    readme = report.render(result, {})
    cpu, gpu = ("Inference ms per image (batch 1, runs on cpu: A, no XLA only):",
                "Inference ms per image (batch 1, runs on gpu: G, no XLA only):")
    assert readme.index(cpu) < readme.index(gpu)  # four cells timed on the CPU, one on the GPU
    header = "| dataset | variant | m = 16 | m = 32 | m = 64 | m = 128 | m = 256 |\n|---|---|---|---|---|---|---|\n"
    assert f"{cpu}\n\n{header}| MNIST | favor-absolute | – | 2.000 | 4.000 | 8.000 | 16.000 |\n\n" in readme
    assert f"{gpu}\n\n{header}| MNIST | favor-absolute | 0.500 | – | – | – | – |\n\n" in readme


def test_compute_time_sums_each_part_of_the_queue_and_counts_a_shared_run_once_in_its_first_part():
    def cell(directory, experiment, minutes):
        return {"directory": directory, "dataset": directory.split("/")[-2], "experiment": experiment,
                "variant": "softmax-absolute", "per_seed": {seed: {"device": "cpu: A"} for seed in minutes},
                "jit_compile": {seed: True for seed in minutes}, "epoch_minutes": minutes}

    cells = [cell("runs/cifar10/softmax-absolute", "variants", {"0": 30.0, "1": 60.0, "3": 90.0}),
             cell("ablations/normalize_qk/cifar10/softmax-absolute-qknorm-on", "normalize_qk", {"0": 120.0}),
             cell("runs/cifar10/softmax-absolute", "num_features", {"0": 30.0}),  # the main row's folder
             cell("runs/mnist/softmax-absolute", "variants", {"0": 6.0}),
             dict(cell("runs/mnist/exp-absolute", "variants", {"0": 6.0}), variant="exp-absolute")]
    compute = aggregate.compute_time(cells, main_seeds=(0, 1, 2))
    assert (compute["cifar10"]["runs"], compute["cifar10"]["hours"]) == (4, 5.0)
    assert compute["cifar10"]["parts"] == [{"part": "main table", "runs": 2, "hours": 1.5},
                                           {"part": "more seeds", "runs": 1, "hours": 1.5},
                                           {"part": "normalize_qk", "runs": 1, "hours": 2.0}]
    assert compute["mnist"]["parts"] == [{"part": "main table", "runs": 1, "hours": pytest.approx(0.1)},
                                         {"part": "extra rows", "runs": 1, "hours": pytest.approx(0.1)}]
    assert ("All datasets: 6 runs, 5.2 hours of training epochs. Per part of the queue: CIFAR-10 main table: "
            "2 runs, 1.5 hours; CIFAR-10 seeds beyond the main table's: 1 run, 1.5 hours; CIFAR-10 q/k "
            "normalisation ablation: 1 run, 2.0 hours; MNIST main table: 1 run, 0.1 hours; MNIST extra rows: 1 run, "
            "0.1 hours.") in "\n".join(
        report.compute_lines({"compute": compute}))


def test_a_run_left_to_the_default_counts_as_xla_by_what_its_sessions_recorded(tmp_path):
    def ran(config, *sessions):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        if sessions:
            (folder / "provenance.json").write_text(json.dumps({"sessions": list(sessions)}))
        return aggregate.ran_with_xla(config, aggregate.read_sessions(folder))

    default, tf, jax = {"variant": "softmax-absolute"}, {"keras_backend": "tensorflow"}, {"keras_backend": "jax"}
    assert ran(dict(default, jit_compile=True)) and not ran(dict(default, jit_compile=False), dict(tf, jit_compile=True))
    assert ran(default, dict(tf, jit_compile=True), dict(tf, jit_compile=True))
    assert not ran(default, dict(tf, jit_compile=True), dict(tf, jit_compile=False))  # resumed without it
    # Sessions from before provenance kept the setting ran with Keras' "auto": XLA on JAX only.
    assert ran(default, jax) and not ran(default, tf) and not ran(default)


def test_normalisation_rows_complete_the_position_by_normalisation_square(tmp_path):
    # (kernel, position, q/k normalised) -> accuracies of seeds 0, 1, 2.
    table = {
        ("softmax", "absolute", False): (0.90, 0.91, 0.92), ("softmax", "absolute", True): (0.89, 0.91, 0.90),
        ("softmax", "kerple", True): (0.92, 0.93, 0.93), ("softmax", "kerple", False): (0.91, 0.92, 0.94),
        ("favor", "absolute", False): (0.88, 0.90, 0.89), ("favor", "absolute", True): (0.86, 0.87, 0.89),
        ("favor", "kerple", True): (0.91, 0.92, 0.90), ("favor", "kerple", False): (0.85, 0.88, 0.88),
    }
    profile = dataclasses.replace(get_profile("cpu"), more_seeds={})  # seeds 0-2 of every cell
    variants = ["softmax-absolute", "favor-absolute", "softmax-kerple", "favor-kerple"]
    jobs = benchmark.plan(profile, tmp_path, variants=variants, datasets=["cifar10"],
                          experiments=["variants", "normalize_qk"])
    root = benchmark.profile_root(tmp_path, profile)
    switched = [job for job in jobs if job.experiment == "normalize_qk"]
    assert sorted({job.cell for job in switched}) == [
        f"ablations/normalize_qk/cifar10/{v}" for v in ("favor-absolute-qknorm-on", "favor-kerple-qknorm-off",
                                                         "softmax-absolute-qknorm-on", "softmax-kerple-qknorm-off")]
    for job in jobs:
        kernel, _, position = job.variant.partition("-")
        assert job.config.normalizes_qk == (position == "kerple") ^ (job.experiment == "normalize_qk")
        assert job.config.qk_norm == 0.25
        accuracy = table[(kernel, position, job.config.normalizes_qk)][job.seed]
        fake_run(job.folder(root), job.config, accuracy, [accuracy], test_examples=10_000)
    result = aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path))
    contrasts = {(c["kernel"], c["contrast"]): c for c in result["normalization"]}

    def mean_of(*cells):  # mean over seeds of cells[0] - cells[1] (- (cells[2] - cells[3]))
        values = [table[c] for c in cells]
        signs = (1, -1, -1, 1)[: len(values)]
        return statistics.mean(sum(sign * v[s] for sign, v in zip(signs, values)) for s in range(3))

    expected = {
        ("favor", "kerple - absolute, q/k norm on"): mean_of(("favor", "kerple", True), ("favor", "absolute", True)),
        ("favor", "kerple - absolute, q/k norm off"): mean_of(("favor", "kerple", False), ("favor", "absolute", False)),
        ("favor", "q/k norm on - off, absolute"): mean_of(("favor", "absolute", True), ("favor", "absolute", False)),
        ("favor", "q/k norm on - off, kerple"): mean_of(("favor", "kerple", True), ("favor", "kerple", False)),
        ("favor", "gap to softmax, absolute, q/k norm on"): mean_of(("favor", "absolute", True), ("softmax", "absolute", True)),
        ("favor", "gap to softmax, absolute, q/k norm off"): mean_of(("favor", "absolute", False), ("softmax", "absolute", False)),
        ("favor", "gap to softmax, kerple, q/k norm on"): mean_of(("favor", "kerple", True), ("softmax", "kerple", True)),
        ("favor", "gap to softmax, kerple, q/k norm off"): mean_of(("favor", "kerple", False), ("softmax", "kerple", False)),
        ("favor", "gap closed by kerple, q/k norm on"): mean_of(
            ("favor", "kerple", True), ("softmax", "kerple", True), ("favor", "absolute", True), ("softmax", "absolute", True)),
        ("favor", "gap closed by kerple, q/k norm off"): mean_of(
            ("favor", "kerple", False), ("softmax", "kerple", False), ("favor", "absolute", False), ("softmax", "absolute", False)),
        ("softmax", "kerple - absolute, q/k norm on"): mean_of(("softmax", "kerple", True), ("softmax", "absolute", True)),
        ("softmax", "kerple - absolute, q/k norm off"): mean_of(("softmax", "kerple", False), ("softmax", "absolute", False)),
        ("softmax", "q/k norm on - off, absolute"): mean_of(("softmax", "absolute", True), ("softmax", "absolute", False)),
        ("softmax", "q/k norm on - off, kerple"): mean_of(("softmax", "kerple", True), ("softmax", "kerple", False)),
    }
    assert set(contrasts) == set(expected)
    for key, mean in expected.items():
        assert contrasts[key]["mean"] == pytest.approx(mean), key
        assert contrasts[key]["n"] == 3 and contrasts[key]["p_value"] is not None
    # By hand: favor gap closed with normalisation on, per seed
    # (.91-.92)-(.86-.89) = .02, (.92-.93)-(.87-.91) = .03, (.90-.93)-(.89-.90) = -.02: mean .01.
    assert contrasts[("favor", "gap closed by kerple, q/k norm on")]["mean"] == pytest.approx(0.01)

    (root / "aggregate.json").write_text(json.dumps(result))
    readme = report.write_report(json.loads((root / "aggregate.json").read_text()), root, tmp_path).read_text()
    assert "## Ablation: the position against q/k normalisation" in readme
    assert "to norm 0.25 √d" in readme and "gap closed by kerple, q/k norm on" in readme
    assert "q/k normalisation ablation 12 of 12" in readme


def test_the_reference_profile_reads_rope_at_a_fixed_normalisation_too(tmp_path):
    # Seeds 0-2; (kernel, position, q/k normalised) -> accuracies. Favor collapses unnormalised, as it did on the GPU.
    table = {
        ("softmax", "absolute", False): (0.980, 0.990, 0.985), ("softmax", "absolute", True): (0.982, 0.984, 0.983),
        ("softmax", "rope", False): (0.990, 0.991, 0.989), ("softmax", "rope", True): (0.985, 0.987, 0.986),
        ("softmax", "kerple", True): (0.986, 0.988, 0.987), ("softmax", "kerple", False): (0.987, 0.986, 0.985),
        ("favor", "absolute", False): (0.970, 0.975, 0.980), ("favor", "absolute", True): (0.981, 0.985, 0.983),
        ("favor", "rope", False): (0.960, 0.970, 0.975), ("favor", "rope", True): (0.986, 0.984, 0.988),
        ("favor", "kerple", True): (0.984, 0.986, 0.985), ("favor", "kerple", False): (0.975, 0.977, 0.976),
    }
    profile = get_profile("reference")
    variants = [f"{kernel}-{position}" for position in ("absolute", "rope", "kerple") for kernel in ("softmax", "favor")]
    jobs = benchmark.plan(profile, tmp_path, variants=variants, datasets=["mnist"], experiments=["variants", "normalize_qk"])
    root = benchmark.profile_root(tmp_path, profile)
    assert sorted(job.cell.rpartition("/")[2] for job in jobs if job.experiment == "normalize_qk" and job.seed == 0) == [
        "favor-absolute-qknorm-on", "favor-kerple-qknorm-off", "favor-rope-qknorm-on",
        "softmax-absolute-qknorm-on", "softmax-kerple-qknorm-off", "softmax-rope-qknorm-on"]
    for job in jobs:
        kernel, _, position = job.variant.partition("-")
        accuracy = table[(kernel, position, job.config.normalizes_qk)][job.seed]
        collapse = kernel == "favor" and not job.config.normalizes_qk
        fake_run(job.folder(root), job.config, accuracy, [0.9, 0.6, accuracy] if collapse else [accuracy],
                 test_examples=10_000)
    result = aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path))
    names = [(c["kernel"], c["contrast"]) for c in result["normalization"]]
    assert len(names) == len(set(names))  # the normalisation at absolute positions is one contrast, not one per position
    assert names[:7] == [("softmax", "rope - absolute, q/k norm on"), ("softmax", "rope - absolute, q/k norm off"),
                         ("softmax", "q/k norm on - off, absolute"), ("softmax", "q/k norm on - off, rope"),
                         ("softmax", "kerple - absolute, q/k norm on"), ("softmax", "kerple - absolute, q/k norm off"),
                         ("softmax", "q/k norm on - off, kerple")]
    contrasts = {name: c for name, c in zip(names, result["normalization"])}
    # Per kernel: P - absolute at each normalisation (2 per P), the normalisation at each position (1 + 1 per P);
    # favor also its gap to softmax at each position and normalisation (2 + 2 per P) and the gap closed (2 per P).
    assert len(contrasts) == (2 * 2 + 1 + 2) + (2 * 2 + 1 + 2 + 2 + 2 * 2 + 2 * 2)
    # By hand, favor's gap to softmax at absolute positions, normalised: (.981-.982, .985-.984, .983-.983), mean 0.
    assert contrasts[("favor", "gap to softmax, absolute, q/k norm on")]["mean"] == pytest.approx(0.0, abs=1e-12)
    # By hand, the gap closed by rope with q and k normalised, per seed:
    # (.986-.985)-(.981-.982) = .002, (.984-.987)-(.985-.984) = -.004, (.988-.986)-(.983-.983) = .002; mean 0.
    assert contrasts[("favor", "gap closed by rope, q/k norm on")]["mean"] == pytest.approx(0.0, abs=1e-12)
    # Unnormalised: (.960-.990)-(.970-.980) = -.020, (.970-.991)-(.975-.990) = -.006, (.975-.989)-(.980-.985) = -.009.
    assert contrasts[("favor", "gap closed by rope, q/k norm off")]["mean"] == pytest.approx(-0.035 / 3)
    assert contrasts[("favor", "gap closed by rope, q/k norm off")]["baseline"] == (
        "softmax-rope + (favor-absolute - softmax-absolute), all q/k norm off")
    readme = report.render(result, {})
    assert "| dataset | kernel | absolute, norm off | absolute, norm on | rope, norm on | rope, norm off | kerple, norm on" in readme
    falls, none = "0: 30.00 (2), 1: 30.00 (2), 2: 30.00 (2)", "0: 0.00 (1), 1: 0.00 (1), 2: 0.00 (1)"
    assert f"| MNIST | favor | {falls} | {none} | {none} | {falls} |" in readme  # favor fell unnormalised only


def test_learning_rate_rows_read_the_gap_at_their_own_rate(tmp_path):
    # Seeds 0-2; (variant, peak learning rate) -> accuracies: favor falls behind at the profile's 1e-3, not at 5e-4.
    table = {("softmax-absolute", 1e-3): (0.988, 0.987, 0.989), ("favor-absolute", 1e-3): (0.975, 0.980, 0.970),
             ("softmax-absolute", 5e-4): (0.986, 0.988, 0.985), ("favor-absolute", 5e-4): (0.985, 0.984, 0.987)}
    profile = get_profile("reference")
    jobs = benchmark.plan(profile, tmp_path, variants=["favor-absolute", "softmax-absolute"], datasets=["mnist"],
                          experiments=["variants", "learning_rate"])
    root = benchmark.profile_root(tmp_path, profile)
    changed = [job for job in jobs if job.experiment == "learning_rate"]
    assert sorted({job.cell for job in changed}) == [
        "ablations/learning_rate/mnist/favor-absolute-lr0.0005", "ablations/learning_rate/mnist/softmax-absolute-lr0.0005"]
    for job in jobs:
        # Only the rate differs from the variant row.
        assert job.config == profile.config(job.variant, "mnist", job.seed, learning_rate=job.config.learning_rate)
        accuracy = table[(job.variant, job.config.learning_rate)][job.seed]
        # favor at 1e-3 collapses after the warm-up epoch (by 0.40, 0.45 and 0.50) and recovers.
        collapse = job.variant == "favor-absolute" and job.config.learning_rate == 1e-3
        curve = [0.9, 0.5 - 0.05 * job.seed, accuracy] if collapse else [0.9, 0.95, accuracy]
        fake_run(job.folder(root), job.config, accuracy, curve, test_examples=10_000)
    result = aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path))
    rows = {(c["experiment"], c["variant"]): c for c in result["cells"]}
    assert rows[("variants", "favor-absolute")]["val_fall"]["mean"] == pytest.approx(0.45)
    assert rows[("variants", "favor-absolute")]["per_seed"]["2"]["val_fall"] == {"fall": pytest.approx(0.5), "epoch": 2}
    assert rows[("learning_rate", "favor-absolute")]["val_fall"]["max"] == 0.0
    favor = rows[("learning_rate", "favor-absolute")]
    assert favor["setting"] == {"learning_rate": 5e-4}
    # By hand: favor at 5e-4 minus at 1e-3 per seed .010, .004, .017; minus softmax at 5e-4 -.001, -.004, .002.
    assert favor["change_from_profile_rate"]["mean"] == pytest.approx(0.031 / 3)
    assert favor["gap_to_softmax_same_rate"]["mean"] == pytest.approx(-0.003 / 3)
    # Gap closed: (-.001 - (.975 - .988), -.004 - (.980 - .987), .002 - (.970 - .989)) = (.012, .003, .021).
    assert favor["gap_closed_by_rate"]["mean"] == pytest.approx(0.036 / 3)
    assert favor["gap_closed_by_rate"]["seeds"] == [0, 1, 2]
    assert favor["gap_closed_by_rate"]["baseline"] == (
        "softmax-absolute at 0.0005 + (favor-absolute - softmax-absolute, the profile's rate)")
    softmax = rows[("learning_rate", "softmax-absolute")]
    assert softmax["change_from_profile_rate"]["mean"] == pytest.approx(-0.005 / 3)
    assert "gap_to_softmax_same_rate" not in softmax and "gap_closed_by_rate" not in softmax
    assert all("p_holm" not in (c.get(key) or {}) for c in result["cells"]
               for key in ("change_from_profile_rate", "gap_to_softmax_same_rate", "gap_closed_by_rate"))
    readme = report.render(result, {})
    assert "## Ablation: the peak learning rate" in readme
    assert "| MNIST | favor-absolute | 0.0005 | gap closed by the rate |" in readme
    assert "| 0: 40.00 (2), 1: 45.00 (2), 2: 50.00 (2) | 0: 0.00 (1), 1: 0.00 (1), 2: 0.00 (1) |" in readme  # 1e-3, 5e-4
    assert readme.count("| 0: 40.00 (2), 1: 45.00 (2), 2: 50.00 (2) |") == 2  # there and in the MNIST detail table
    assert "learning-rate ablation 6 of 6" in readme
    assert "on the floor" not in readme  # no run has a favor_floor.json: no column for it
    with pytest.raises(ValueError, match="lists its own learning rate 0.001"):
        dataclasses.replace(profile, learning_rate=dict(variants=("favor-absolute",), values=(1e-3,), datasets=("mnist",)))


def test_stabilizer_rows_read_favor_against_softmax_s_own_row(tmp_path):
    # Softmax reads no stabiliser: its rows are the baselines at either value, and a gap closed would repeat the change.
    table = {("softmax-absolute", "logits"): (0.988, 0.987, 0.989), ("favor-absolute", "logits"): (0.975, 0.980, 0.970),
             ("favor-absolute", "exponent"): (0.986, 0.983, 0.988), ("softmax-rope", "logits"): (0.990, 0.989, 0.991),
             ("favor-rope", "logits"): (0.965, 0.950, 0.970), ("favor-rope", "exponent"): (0.990, 0.984, 0.987)}
    profile = get_profile("reference")
    jobs = benchmark.plan(profile, tmp_path, variants=["favor-absolute", "softmax-absolute", "favor-rope", "softmax-rope"],
                          datasets=["mnist"], experiments=["variants", "stabilizer"])
    root = benchmark.profile_root(tmp_path, profile)
    changed = [job for job in jobs if job.experiment == "stabilizer"]
    assert [(job.cell, job.seed) for job in changed] == [
        (f"ablations/stabilizer/mnist/favor-{position}-stabilizer-exponent", seed)
        for position in ("absolute", "rope") for seed in (0, 1, 2)]
    for job in jobs:
        assert job.config == profile.config(job.variant, "mnist", job.seed, stabilizer=job.config.stabilizer)
        fake_run(job.folder(root), job.config, table[(job.variant, job.config.stabilizer)][job.seed], [0.9, 0.95],
                 test_examples=10_000)
    # favor_floor.json (`experiments.favor_floor`) in two runs: the largest share over checkpoints and layers, kerple's
    # null passed over; a damaged one is named in its cell rather than stopping the report.
    ablation = root / "ablations" / "stabilizer" / "mnist"
    layers = lambda *masses: [{"layer": f"block_{i}_attention", "floor_mass": m} for i, m in enumerate(masses)]
    (ablation / "favor-absolute-stabilizer-exponent" / "seed1" / "favor_floor.json").write_text(json.dumps(
        {"checkpoints": [{"epoch": 20, "layers": layers(0.01, 0.02)}, {"epoch": 2, "layers": layers(0.03, None)},
                         {"epoch": 8, "layers": layers(0.05, 0.12)}]}))
    (ablation / "favor-rope-stabilizer-exponent" / "seed2" / "favor_floor.json").write_text('{"checkpoints": [')
    result = aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path))
    absolute, rope = (c for c in result["cells"] if c["experiment"] == "stabilizer")
    assert absolute["per_seed"]["1"]["favor_floor"] == {"floor_mass": 0.12, "layer": "block_1_attention", "epoch": 8}
    assert absolute["per_seed"]["0"]["favor_floor"] is None
    assert "favor-rope-stabilizer-exponent/seed2/favor_floor.json is damaged" in rope["per_seed"]["2"]["favor_floor"]["damaged"]
    assert absolute["setting"] == rope["setting"] == {"stabilizer": "exponent"}
    # By hand: favor-absolute with the exponent minus with the logits .011, .003, .018; minus softmax -.002, -.004, -.001.
    assert absolute["change_from_profile_stabilizer"]["mean"] == pytest.approx(0.032 / 3)
    assert absolute["change_from_profile_stabilizer"]["baseline"] == "favor-absolute with the profile's stabiliser"
    assert absolute["gap_to_softmax_same_stabilizer"]["mean"] == pytest.approx(-0.007 / 3)
    assert absolute["gap_to_softmax_same_stabilizer"]["baseline"] == "softmax-absolute"
    assert "gap_closed_by_stabilizer" not in absolute and "interaction_same_stabilizer" not in absolute
    # favor-rope minus softmax-rope, both at the exponent: .000, -.005, -.004; less favor-absolute's gap above:
    # .002, -.001, -.003.
    assert rope["gap_to_softmax_same_stabilizer"]["mean"] == pytest.approx(-0.009 / 3)
    assert rope["interaction_same_stabilizer"]["mean"] == pytest.approx(-0.002 / 3)
    assert rope["interaction_same_stabilizer"]["baseline"] == (
        "softmax-rope + (favor-absolute with exponent - softmax-absolute)")
    readme = report.render(result, {})
    assert "## Ablation: FAVOR+'s stabiliser" in readme
    assert "than the profile's (logits)" in readme
    assert "| MNIST | favor-absolute | exponent | gap to softmax | softmax-absolute |" in readme
    assert "| MNIST | favor-rope | exponent | gap closed by the position | softmax-rope + (favor-absolute with " in readme
    assert "| fall with this stabiliser | on the floor with this stabiliser |" in readme
    assert "| 0: 0.00 (1), 1: 0.00 (1), 2: 0.00 (1) | 1: 0.120 (block 1, epoch 8) |" in readme
    assert "| 2: " + rope["per_seed"]["2"]["favor_floor"]["damaged"] + " |" in readme
    assert "stabiliser ablation 6 of 6" in readme
    # One finished pair is a difference without an interval or a test, and says so.
    assert report.test_text(aggregate.paired_difference({0: 0.986}, {0: 0.975})) == "+1.10 (one pair: no interval, no test)"
    with pytest.raises(ValueError, match="lists its own stabiliser logits"):
        dataclasses.replace(profile, stabilizer=dict(variants=("favor-absolute",), values=("logits",), datasets=("mnist",)))
    with pytest.raises(ValueError, match="ablates stabilizer of relu-rope, which does not read it"):
        dataclasses.replace(profile, stabilizer=dict(variants=("relu-rope",), values=("exponent",), datasets=("mnist",)))


def test_paired_statistics_holm_and_interaction_by_hand(tmp_path):
    # Accuracies of seeds 0, 1, 2. Every difference below has n = 3, so t has 2
    # degrees of freedom, where the two-sided p-value is 1 - t / sqrt(t^2 + 2).
    table = {
        "softmax-absolute": (0.90, 0.91, 0.92),
        "favor-absolute": (0.88, 0.90, 0.89),
        "softmax-rope": (0.91, 0.93, 0.92),
        "favor-rope": (0.90, 0.93, 0.92),
    }
    profile = get_profile("small")
    jobs = benchmark.plan(profile, tmp_path, variants=list(table), datasets=["mnist"], seeds=[0, 1, 2],
                          experiments=["variants"])
    root = benchmark.profile_root(tmp_path, profile)
    for job in jobs:
        accuracy = table[job.variant][job.seed]
        fake_run(job.folder(root), job.config, accuracy, [accuracy], test_examples=10_000)
    result = aggregate.aggregate(root, benchmark.cells(jobs), **benchmark.report_header(profile, tmp_path))
    cells = {c["variant"]: c for c in result["cells"]}

    def p(t):
        return 1 - abs(t) / math.sqrt(t * t + 2)

    # favor-absolute - softmax-absolute = (-.02, -.01, -.03): mean -.02, std .01, t = -3.4641,
    # interval -.02 +- 4.302653 x .01 / sqrt 3.
    gap = cells["favor-absolute"]["gap_to_softmax"]
    assert gap["ci95"] == pytest.approx([-0.02 - 0.0248414, -0.02 + 0.0248414], abs=1e-6)
    assert gap["p_value"] == pytest.approx(p(-2 * math.sqrt(3)), abs=1e-6)
    # The interaction: (favor-rope - softmax-rope) - (favor-absolute - softmax-absolute)
    # = (-.01, 0, 0) - (-.02, -.01, -.03) = (.01, .01, .03): mean .016667, std .011547,
    # t = 2.5, interval +- 4.302653 x .011547 / sqrt 3 = +- .028684.
    interaction = cells["favor-rope"]["interaction"]
    assert interaction["seeds"] == [0, 1, 2]
    # Named as what the row is measured against: favor-rope - that = the interaction, signs included.
    assert interaction["baseline"] == "softmax-rope + (favor-absolute - softmax-absolute)"
    assert interaction["mean"] == pytest.approx(0.0166667, abs=1e-6)
    assert interaction["ci95"] == pytest.approx([0.0166667 - 0.028684, 0.0166667 + 0.028684], abs=1e-5)
    assert interaction["p_value"] == pytest.approx(p(2.5), abs=1e-6)
    # Power: n = 3, std .011547: the smallest difference found 80% of the time is
    # 3.264044 std (the noncentral t; simulated in test_significance.py).
    assert interaction["mde"] == pytest.approx(3.264044 * 0.011547, rel=1e-4)
    # The same in units of the spread, for the one seed count planned: what the report quotes.
    assert result["family"]["detectable_in_sd"] == {"3": pytest.approx(3.264044, rel=1e-4)}
    # The family: softmax-rope's gain (t = 1.7321), favor-absolute's gap (t = -3.4641),
    # favor-rope's gap to softmax-absolute (t = 1), to softmax-rope (t = -1), its gain
    # over favor-absolute (d = .02, .03, .03: t = 8) and the interaction (t = 2.5).
    # Holm with k = 6 multiplies the sorted p-values by 6, 5, 4, 3, 2, 1 (kept monotone).
    assert result["family"]["size"] == 6
    gain = cells["favor-rope"]["gain_over_absolute"]
    assert gain["p_value"] == pytest.approx(p(8.0), abs=1e-6) and gain["p_value"] < 0.05
    assert gain["p_holm"] == pytest.approx(6 * p(8.0), abs=1e-6)
    assert gain["verdict"] == "not separated"  # 0.0153 alone, 0.0916 in a family of six
    assert gap["p_holm"] == pytest.approx(5 * p(-2 * math.sqrt(3)), abs=1e-6)
    assert interaction["p_holm"] == pytest.approx(4 * p(2.5), abs=1e-6)
    assert cells["softmax-rope"]["gap_to_softmax"]["p_holm"] == pytest.approx(3 * p(math.sqrt(3)), abs=1e-6)
    assert cells["favor-rope"]["gap_to_softmax"]["p_holm"] == pytest.approx(2 * p(1.0), abs=1e-6)
    assert cells["favor-rope"]["gap_to_softmax_same_position"]["p_holm"] == pytest.approx(2 * p(1.0), abs=1e-6)
    assert "p_holm" not in cells["favor-absolute"]["gap_to_softmax_same_position"]  # repeats its gap
    # Test-set sampling error of softmax-absolute's mean .91 on 10,000 images: sqrt(.91 x .09 / 10^4).
    assert cells["softmax-absolute"]["test_sampling_error"]["standard_error"] == pytest.approx(0.0028618, abs=1e-7)

    readme = report.render(result, {})
    assert "Holm" in readme and "+1.67 [-1.20, 4.54]" in readme


# === End to end: kill, resume, aggregate by hand, report ===


def _fake_finished_run(folder, epoch_seconds, device=None):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({} if device is None else {"device": device}))
    (folder / "best.keras").write_text("checkpoint")
    (folder / "backup").mkdir()
    rows = "".join(f"{epoch},{seconds}\n" for epoch, seconds in enumerate(epoch_seconds))
    (folder / "history.csv").write_text("epoch,epoch_seconds\n" + rows)


def test_runs_past_max_runs_are_left_as_asked_not_skipped_and_the_exit_status_is_0(tmp_path, capsys):
    # A batch job that trains its chunk of the queue (--max-runs N) and stops as asked has not failed: exit 0, as
    # --max-minutes gives. A run skipped for a missing init-from checkpoint still gives 1.
    profile = get_profile("tiny")  # softmax-absolute and favor-absolute, seeds 0 and 1
    root = benchmark.profile_root(tmp_path, profile)
    trained = []

    def fake_train(config, folder, verbose=0, keep_epochs=()):
        trained.append((str(folder), keep_epochs))
        return {"test_accuracy": 0.5}

    argv = ["--profile", "tiny", "--results-dir", str(tmp_path), "--max-runs", "1", "--keep-epochs", "1"]
    with mock.patch("experiments.training.train", side_effect=fake_train), \
            mock.patch.object(benchmark, "write_aggregate", return_value={"runs": {"finished": 0, "planned": 4}}):
        assert benchmark.main(argv) == 0
    jobs = benchmark.plan(profile, tmp_path)
    assert trained == [(str(jobs[0].folder(root)), [1])]
    assert "trained 1, failed 0, skipped 0, left for lack of time 0, left by --max-runs 3;" in capsys.readouterr().out
    outcome = benchmark.run_queue(jobs, root, max_runs=0, log=lambda line: None)
    assert outcome["over_max_runs"] == [str(job.folder(root)) for job in jobs] and outcome["skipped"] == []
    needs_missing = dataclasses.replace(jobs[0], needs=tmp_path / "absent" / "best.keras")
    outcome = benchmark.run_queue([needs_missing], root, log=lambda line: None)
    assert outcome["skipped"] == [str(needs_missing.folder(root))]


def test_max_minutes_starts_only_runs_the_time_left_can_finish_and_archive_packs_them(tmp_path):
    import tarfile

    profile = get_profile("tiny")  # 1 epoch per run; softmax-absolute and favor-absolute, seeds 0 and 1
    jobs = benchmark.plan(profile, tmp_path)
    root = benchmark.profile_root(tmp_path, profile)
    first, second, third, fourth = jobs
    _fake_finished_run(first.folder(root), [30.0])
    # The row's own slowest epoch; for favor-absolute, with no finished run, its dataset's.
    assert forecast.expected_seconds(second, root) == 30.0
    assert forecast.expected_seconds(third, root) == 30.0
    _fake_finished_run(third.folder(root), [50.0])
    assert forecast.expected_seconds(fourth, root) == 50.0
    elsewhere = dataclasses.replace(first, variant="x", cell="elsewhere/x")
    assert forecast.expected_seconds(elsewhere, tmp_path) is None
    # Without a forecast a run starts while time is left, and the log says it may not finish.
    lines = []
    benchmark.run_queue([elsewhere], tmp_path, deadline=time.monotonic() - 1, log=lines.append)
    assert lines == []
    with mock.patch("experiments.training.train", side_effect=RunError("stop here")):
        outcome = benchmark.run_queue([elsewhere], tmp_path, deadline=time.monotonic() + 60, log=lines.append)
    assert outcome["failed"] == [str(elsewhere.folder(tmp_path))]
    assert "no finished run of mnist to forecast its time from" in lines[0] and "may not finish" in lines[0]
    # 20 s left: no run fits, none starts, and they are told apart from failures.
    outcome = benchmark.run_queue(jobs, root, deadline=time.monotonic() + 20, log=lambda line: None)
    assert outcome["no_time"] == [str(second.folder(root)), str(fourth.folder(root))]
    assert outcome["trained"] == outcome["failed"] == outcome["skipped"] == []
    (first.folder(root) / "epochs").mkdir()  # what --keep-epochs keeps stays behind, as best.keras does
    (first.folder(root) / "epochs" / "epoch0001.weights.h5").write_bytes(b"weights")
    assert benchmark.pack_finished(jobs, root, tmp_path / "runs.tar.gz") == 2
    with tarfile.open(tmp_path / "runs.tar.gz") as tar:
        names = sorted(tar.getnames())
    assert names == sorted(str(job.folder(root).relative_to(root) / name)
                           for job in (first, third) for name in ("history.csv", "metrics.json"))
    # Written into a finished run folder, twice: neither the archive being written nor its previous copy is in it.
    inside = first.folder(root) / "runs.tar.gz"
    for _ in range(2):
        assert benchmark.pack_finished(jobs, root, inside) == 2
        with tarfile.open(inside) as tar:
            assert sorted(tar.getnames()) == names


@pytest.mark.parametrize("error, logged", [
    (MemoryError("Unable to allocate 3 TiB"), "failed: out of memory (numpy: Unable to allocate 3 TiB)"),
    # A run refused for its own damaged files; the first stopped the queue with a traceback.
    (EvaluationError("Could not load best.keras as a Keras model: best.keras is no .keras file"),
     "failed: Could not load best.keras as a Keras model: best.keras is no .keras file"),
    (RunError("history.csv, line 4, is no epoch's row"), "failed: history.csv, line 4, is no epoch's row"),
])
def test_a_run_that_fails_for_itself_fails_alone_and_the_queue_goes_on(tmp_path, error, logged):
    jobs = benchmark.plan(get_profile("tiny"), tmp_path)[:2]
    root = benchmark.profile_root(tmp_path, get_profile("tiny"))

    def train(config, folder, verbose=0, keep_epochs=()):
        if folder == jobs[0].folder(root):
            raise error
        _fake_finished_run(Path(folder), [1.0])
        return {"test_accuracy": 0.5}

    lines = []
    with mock.patch("experiments.training.train", side_effect=train):
        outcome = benchmark.run_queue(jobs, root, log=lines.append)
    assert outcome["failed"] == [str(jobs[0].folder(root))] and outcome["trained"] == [str(jobs[1].folder(root))]
    assert any(line.endswith(logged) for line in lines), lines


def test_any_other_error_stops_the_queue(tmp_path):
    jobs = benchmark.plan(get_profile("tiny"), tmp_path)[:2]
    with mock.patch("experiments.training.train", side_effect=RuntimeError("a bug")), pytest.raises(RuntimeError):
        benchmark.run_queue(jobs, benchmark.profile_root(tmp_path, get_profile("tiny")), log=lambda line: None)


def test_a_forecast_counts_only_runs_with_the_jobs_xla_setting(tmp_path):
    profile = get_profile("tiny")  # 1 epoch per run; softmax-absolute and favor-absolute, seeds 0 and 1
    first, second, third, _ = benchmark.plan(profile, tmp_path)
    root = benchmark.profile_root(tmp_path, profile)
    _fake_finished_run(first.folder(root), [100.0])
    (first.folder(root) / "config.json").write_text(json.dumps({"jit_compile": False}))
    _fake_finished_run(third.folder(root), [40.0])  # left to the default, which its session ran with XLA
    (third.folder(root) / "config.json").write_text(json.dumps({"jit_compile": None}))
    (third.folder(root) / "provenance.json").write_text(json.dumps({"sessions": [{"jit_compile": True}]}))

    def with_xla(job, jit):
        return dataclasses.replace(job, config=dataclasses.replace(job.config, jit_compile=jit))

    # softmax-absolute's own row has only a run without XLA: an XLA job falls back to the dataset's XLA runs.
    assert forecast.expected_seconds(with_xla(second, True), root, statistics.median) == 40.0
    assert forecast.expected_seconds(with_xla(second, False), root, statistics.median) == 100.0
    assert forecast.expected_seconds(second, root, statistics.median) == 100.0  # no setting: its row, as it is
    assert forecast.expected_seconds(with_xla(second, None), root, max) == 100.0


def test_a_deadline_and_the_forecast_read_the_runs_of_one_device_first(tmp_path):
    profile = get_profile("tiny")  # 1 epoch per run; softmax-absolute and favor-absolute, seeds 0 and 1
    first, second, third, fourth = benchmark.plan(profile, tmp_path)
    root = benchmark.profile_root(tmp_path, profile)
    # softmax-absolute's own row ran on a slow CPU, favor-absolute's on a GPU.
    _fake_finished_run(first.folder(root), [600.0], device="cpu: slow (2 cores)")
    _fake_finished_run(third.folder(root), [10.0], device="gpu: fast")
    assert forecast.expected_seconds(second, root) == 600.0  # any device: its own row
    assert forecast.expected_seconds(second, root, device="cpu: slow (2 cores)") == 600.0
    # On the GPU its own row's CPU run does not count; the dataset's GPU run does.
    assert forecast.expected_seconds(second, root, device="gpu: fast") == 10.0
    assert forecast.expected_seconds(fourth, root, device="cpu: slow (2 cores)") == 600.0
    assert forecast.expected_seconds(second, root, device="gpu: other") is None
    # A device that ran only an ablation of the dataset is judged by it, not by another device's row.
    ablation = root / "ablations" / "stabilizer" / "mnist" / "favor-absolute-stabilizer-exponent" / "seed0"
    _fake_finished_run(ablation, [20.0], device="gpu: other")
    assert forecast.expected_seconds(second, root, device="gpu: other") == 20.0
    shutil.rmtree(ablation)

    def queue(device):
        with mock.patch("experiments.training.train", return_value={"test_accuracy": 0.5}) as train:
            outcome = benchmark.run_queue([second], root, deadline=time.monotonic() + 60, log=lambda line: None,
                                          device=device)
        return outcome["no_time"], train.call_count

    # 60 s left: the GPU starts the run its CPU row says takes 600 s; the CPU does not.
    assert queue("gpu: fast") == ([], 1)
    assert queue("cpu: slow (2 cores)") == ([str(second.folder(root))], 0)
    # A device with no finished run of the dataset falls back to every device's runs.
    assert queue("gpu: other") == ([str(second.folder(root))], 0)
    # Without a device the queue asks this machine's.
    with mock.patch("experiments.latency.device_name", return_value="gpu: fast"):
        assert queue(None) == ([], 1)

    # The forecast is for the device most finished runs ran on: favor-absolute's seed 1 on the GPU too.
    _fake_finished_run(fourth.folder(root), [20.0], device="gpu: fast")
    # A CIFAR-10 run of softmax-absolute, queued, whose dataset only the CPU has run.
    cifar = dataclasses.replace(second, dataset="cifar10", cell=f"runs/cifar10/{second.variant}")
    _fake_finished_run(root / "runs" / "cifar10" / "relu-absolute" / "seed0", [900.0], device="cpu: slow (2 cores)")
    left = forecast.forecast([first, second, third, fourth, cifar], root, profile)
    # Its own row's CPU epoch would say 600 s; the GPU's runs of the dataset say 15 s (their median).
    assert left["minutes"][str(second.folder(root).relative_to(root))] == 15.0 / 60
    # The GPU has no CIFAR-10 run: any device's.
    assert left["minutes"][str(cifar.folder(root).relative_to(root))] == 900.0 / 60
    assert left["basis"].endswith(
        "else of its dataset, run on gpu: fast, the device of 2 of the 3 finished runs (any device's where it has none)")
    assert left["elsewhere"] == [str(cifar.folder(root).relative_to(root))]
    lines = []
    benchmark.list_queue([first, second, third, fourth, cifar], root, profile, log=lines.append)
    # Its own row ran only on the CPU: the GPU's time is another row's, and the line says so.
    assert lines[1] == f"queued    {second.folder(root)}  (under 1 min, from other rows' runs)"
    assert lines[4] == f"queued    {cifar.folder(root)}  (about 15 min, from other rows' and other devices' runs)"
    elsewhere = "; 1 of them, 0.2 of those hours, from other devices' runs, as that device has finished none like them"
    assert lines[-1].endswith(elsewhere)
    assert f"{elsewhere}; `--list`" in report.forecast_lines(left)[0]
    # `--list` on a machine that has finished runs of the queue forecasts for that machine, here the CPU
    # (its own row's 600 s, and its CIFAR-10 run's 900 s), not for the device most runs ran on.
    mine = forecast.forecast([first, second, third, fourth, cifar], root, profile, machine="cpu: slow (2 cores)")
    assert mine["minutes"][str(second.folder(root).relative_to(root))] == 600.0 / 60
    assert mine["minutes"][str(cifar.folder(root).relative_to(root))] == 900.0 / 60
    assert mine["elsewhere"] == []
    assert mine["basis"].endswith("run on cpu: slow (2 cores) (this machine), the device of 1 of the 3 finished runs "
                                  "(any device's where it has none)")
    lines.clear()
    benchmark.list_queue([first, second, third, fourth, cifar], root, profile, log=lines.append,
                         machine="cpu: slow (2 cores)")
    assert lines[1] == f"queued    {second.folder(root)}  (about 10 min)"
    # A machine without a finished run of the queue gets the forecast aggregate.json holds.
    assert forecast.forecast([first, second, third, fourth, cifar], root, profile, machine="gpu: other") == left
    # A tree whose runs name no device is forecast from all of them, and the rule names none.
    plain = tmp_path / "plain"
    _fake_finished_run(first.folder(plain), [600.0])
    assert forecast.forecast([first, second], plain, profile)["basis"].endswith("else of its dataset")


def test_the_first_epoch_which_compiles_is_forecast_apart_from_the_later_ones(tmp_path):
    profile = get_profile("tiny")
    first, second, _, _ = benchmark.plan(profile, tmp_path)
    root = benchmark.profile_root(tmp_path, profile)
    second = dataclasses.replace(second, config=dataclasses.replace(second.config, epochs=4))
    # A GPU run: 40 s to compile and train epoch 1, then 10 s an epoch, one paused to 30 s.
    _fake_finished_run(first.folder(root), [40.0, 10.0, 30.0, 10.0])
    assert forecast.expected_seconds(second, root) == 40.0 + 3 * 30.0  # not 4 x 40 s
    assert forecast.expected_seconds(second, root, statistics.median) == 40.0 + 3 * 10.0
    # A resumed run compiles again in its first epoch: 2 epochs left, one of them the first.
    second.folder(root).mkdir(parents=True)
    (second.folder(root) / "history.csv").write_text("epoch,epoch_seconds\n0,40.0\n1,10.0\n")
    assert forecast.expected_seconds(second, root) == 40.0 + 30.0
    (second.folder(root) / "history.csv").write_text("epoch,epoch_seconds\n" + "".join(f"{e},10.0\n" for e in range(4)))
    assert forecast.expected_seconds(second, root) == 0.0


def test_a_resumed_run_without_a_finished_row_mate_is_forecast_from_its_own_epochs_on_their_device(tmp_path):
    # m = 256 was forecast from m = 16 to 128's epochs (about 160 min) after 7 of its own had taken 940 s each.
    profile = get_profile("tiny")
    first, _, third, _ = benchmark.plan(profile, tmp_path)
    root = benchmark.profile_root(tmp_path, profile)
    third = dataclasses.replace(third, config=dataclasses.replace(third.config, epochs=5))
    _fake_finished_run(first.folder(root), [60.0, 30.0], device="cpu: slow (2 cores)")
    own = third.folder(root)
    own.mkdir(parents=True)

    def trained(seconds, *devices):
        (own / "history.csv").write_text("epoch,epoch_seconds\n" + "".join(f"{e},{t}\n" for e, t in enumerate(seconds)))
        sessions = [{"start_epoch": 0, "jit_compile": True} | ({} if device is None else {"device": device})
                    for device in devices]
        (own / "provenance.json").write_text(json.dumps({"sessions": sessions}))

    trained([150.0], "cpu: slow (2 cores)")  # one epoch, which compiled, tells no later epoch's time
    assert forecast.timing(third, root, statistics.median) == (60.0 + 3 * 30.0, "its dataset")
    trained([150.0, 100.0, 120.0], "cpu: slow (2 cores)")
    assert forecast.timing(third, root, statistics.median) == (150.0 + 110.0, "its own epochs")
    assert forecast.timing(third, root, device="cpu: slow (2 cores)") == (150.0 + 120.0, "its own epochs")
    # Epochs trained on another device, or by a session that named none, do not time it on this one.
    assert forecast.timing(third, root, device="gpu: fast") == (None, None)
    trained([150.0, 100.0, 120.0], "cpu: slow (2 cores)", None)
    assert forecast.timing(third, root, device="cpu: slow (2 cores)") == (60.0 + 30.0, "its dataset")
    assert forecast.timing(third, root) == (150.0 + 120.0, "its own epochs")  # any device's
    trained([150.0, 100.0, 120.0], "cpu: slow (2 cores)")
    lines = []
    benchmark.list_queue([first, third], root, profile, log=lines.append)
    assert lines == [f"finished  {first.folder(root)}",
                     f"queued    {own}  (3 of 5 epochs done; about 4 min, from its own epochs so far)",
                     lines[-1]]
    left = forecast.forecast([first, third], root, profile)
    assert left["sources"] == {str(own.relative_to(root)): "its own epochs"}
    # Its row's finished runs come first: they have every epoch, the first and the later ones.
    row_mate = dataclasses.replace(third, seed=third.seed + 1)
    _fake_finished_run(row_mate.folder(root), [50.0, 20.0], device="cpu: slow (2 cores)")
    assert forecast.timing(third, root, device="cpu: slow (2 cores)") == (50.0 + 20.0, "its row")
    # Forecast for a GPU that has run none of MNIST, its own CPU epochs still time it, and the line says so.
    shutil.rmtree(row_mate.folder(root))
    cifar = dataclasses.replace(first, dataset="cifar10", cell=f"runs/cifar10/{first.variant}")
    _fake_finished_run(cifar.folder(root), [5.0], device="gpu: fast")
    lines.clear()
    benchmark.list_queue([first, cifar, third], root, profile, log=lines.append, machine="gpu: fast")
    assert lines[2] == f"queued    {own}  (3 of 5 epochs done; about 4 min, from its own epochs so far, on another device)"


def test_a_damaged_history_is_left_out_of_the_forecast(tmp_path):
    # An epoch_seconds cell that was no number ended the queue, its list and its forecast in a traceback.
    profile = get_profile("tiny")
    first, second, _, _ = benchmark.plan(profile, tmp_path)
    root = benchmark.profile_root(tmp_path, profile)
    _fake_finished_run(first.folder(root), [40.0, 10.0])
    with open(first.folder(root) / "history.csv", "a") as f:
        f.write("2,abc\n")
    assert forecast.expected_seconds(second, root) is None
    second.folder(root).mkdir(parents=True)  # its own history damaged: it trains again once mended, so all of it
    (second.folder(root) / "history.csv").write_text("epoch,epoch_seconds\n0,\n")
    (first.folder(root) / "history.csv").write_text("epoch,epoch_seconds\n0,40.0\n")
    assert forecast.expected_seconds(second, root) == 40.0 * second.config.epochs


def test_list_forecasts_each_queued_run_from_the_median_epoch_of_runs_like_it(tmp_path, capsys):
    profile = get_profile("tiny")  # 1 epoch per run; softmax-absolute and favor-absolute, seeds 0 and 1
    jobs = benchmark.plan(profile, tmp_path)
    root = benchmark.profile_root(tmp_path, profile)
    first, second, third, fourth = jobs
    _fake_finished_run(first.folder(root), [1200.0, 600.0, 6000.0])
    # An ablation of a variant without a finished run of its own is forecast from the variant's row.
    ablation = dataclasses.replace(third, variant=first.variant, cell=f"ablations/x/{first.dataset}/{first.variant}-x")
    assert forecast.expected_seconds(ablation, root) == 1200.0  # 1 epoch: the first epoch's time
    lines = []
    benchmark.list_queue(jobs, root, profile, log=lines.append)
    assert lines[:2] == [f"finished  {first.folder(root)}", f"queued    {second.folder(root)}  (about 20 min)"]
    # favor-absolute has no finished run of its own: its time is softmax-absolute's, and the line says so.
    assert lines[2] == f"queued    {third.folder(root)}  (about 20 min, from other rows' runs)"
    assert lines[-1].startswith("1 of 4 runs finished; the 3 queued runs with a forecast need about 1.0 hours")
    # The same forecast, per part of the queue, reaches aggregate.json and the report.
    left = benchmark.report_header(profile, tmp_path)["forecast"]
    assert (left["runs"], left["hours"], left["without_forecast"]) == (3, 1.0, 0)
    assert left["parts"] == [{"dataset": "mnist", "part": "main table", "runs": 3, "hours": 1.0, "without_forecast": 0}]
    assert left["minutes"][str(second.folder(root).relative_to(root))] == 20.0
    assert report.forecast_lines(left)[0].startswith(
        "Forecast for the 3 queued runs: about 1.0 hours of training epochs (each queued run at the median first epoch")
    assert report.forecast_lines(left)[0].endswith("`--list` gives each run's): MNIST main table: 3 runs, 1.0 hours.")
    lines.clear()
    benchmark.list_queue([first], root, profile, log=lines.append)
    assert lines[-1] == "1 of 1 runs finished; the queue is complete"
    # Before, "the 0 queued runs with a forecast need about 0.0 hours of training epochs (...)".
    lines.clear()
    benchmark.list_queue(jobs, tmp_path / "empty", profile, log=lines.append)
    assert lines[-1] == "0 of 4 runs finished; no finished run to forecast the 4 queued runs from"
    # The command prints the same, and writes nothing.
    assert benchmark.main(["--profile", "tiny", "--results-dir", str(tmp_path), "--list"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1] == f"queued    {second.folder(root)}  (about 20 min)" and printed[-1].startswith("1 of 4 runs")
    assert not (root / "aggregate.json").exists()


@pytest.mark.slow
def test_two_workers_share_the_queue_and_the_parent_aggregates_and_archives(tmp_path):
    import tarfile

    archive = tmp_path / "runs.tar.gz"
    assert benchmark.main(["--profile", "tiny", "--results-dir", str(tmp_path), "--workers", "2",
                           "--archive", str(archive), "--keep-epochs", "1"]) == 0
    profile = get_profile("tiny")
    jobs = benchmark.plan(profile, tmp_path)
    root = benchmark.profile_root(tmp_path, profile)
    assert all(benchmark.is_finished(job, root) for job in jobs)
    sessions = [json.loads((job.folder(root) / "provenance.json").read_text())["sessions"] for job in jobs]
    assert all(len(s) == 1 for s in sessions)  # each run trained once, by one worker
    assert all((job.folder(root) / "epochs" / "epoch0001.weights.h5").is_file() for job in jobs)  # passed on to each
    assert json.loads((root / "aggregate.json").read_text())["runs"]["finished"] == len(jobs)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {str(job.folder(root).relative_to(root) / "metrics.json") for job in jobs} <= names
    assert not any(name.endswith("best.keras") or "/backup/" in name or "/epochs/" in name for name in names)
    assert benchmark.drop_options(["--workers", "2", "--archive=x.tar.gz", "--seeds", "0"], ("--workers", "--archive")) \
        == ["--seeds", "0"]


def test_max_runs_counts_every_worker_s_trainings_together():
    # Each worker once took the whole --max-runs: --workers 4 --max-runs 2 trained up to 8 runs.
    assert [benchmark.worker_max_runs(2, 4, k) for k in range(4)] == [1, 1, 0, 0]
    assert [benchmark.worker_max_runs(7, 3, k) for k in range(3)] == [3, 2, 2]
    started = []
    with mock.patch.object(benchmark.subprocess, "Popen") as popen:
        popen.side_effect = lambda command, env: started.append(command) or mock.Mock(wait=lambda: 0)
        assert benchmark.run_workers(["--profile", "tiny", "--workers", "3", "--max-runs=4"], 3, max_runs=4) == 0
    assert [command[command.index("--shard") + 1:] for command in started] == [
        ["0/3", "--max-runs", "2"], ["1/3", "--max-runs", "1"], ["2/3", "--max-runs", "1"]]
    assert all(command.count("--max-runs") == 1 and "--max-runs=4" not in command for command in started)


@pytest.mark.slow  # a real process killed at a chosen moment (pytest.ini); the quick loop keeps the in-process queue tests
def test_killed_benchmark_resumes_and_aggregates(tmp_path, capsys):
    command = [sys.executable, "-m", "experiments.benchmark", "--profile", "tiny", "--results-dir", str(tmp_path)]
    process = subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    root = tmp_path / "tiny"
    try:
        deadline = time.monotonic() + 150
        while not list(root.glob("runs/*/*/seed*/metrics.json")):
            assert process.poll() is None, "the benchmark ended before its first run finished"
            assert time.monotonic() < deadline, "no run finished in time"
            time.sleep(0.1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    first = list(root.glob("runs/*/*/seed*/metrics.json"))
    assert 1 <= len(first) < 4
    before = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in first}

    capsys.readouterr()
    assert benchmark.main(["--profile", "tiny", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"trained {4 - len(first)}, failed 0" in out
    assert all((path.read_bytes(), path.stat().st_mtime_ns) == kept for path, kept in before.items())

    def accuracies(variant):
        return [json.loads((root / f"runs/mnist/{variant}/seed{s}/metrics.json").read_text())["test_accuracy"]
                for s in (0, 1)]

    assert report.main(["--profile", "tiny", "--results-dir", str(tmp_path)]) == 0
    result = json.loads((root / "aggregate.json").read_text())
    cells = {c["variant"]: c for c in result["cells"]}
    softmax, favor = accuracies("softmax-absolute"), accuracies("favor-absolute")
    assert_summary(cells["softmax-absolute"]["test_accuracy"], softmax)
    assert_summary(cells["favor-absolute"]["test_accuracy"], favor)
    gap = cells["favor-absolute"]["gap_to_softmax"]
    assert gap["seeds"] == [0, 1]
    assert_summary({k: v for k, v in gap.items() if k not in ("seeds", "baseline")}, [f - s for f, s in zip(favor, softmax)])
    assert result["runs"] == {"planned": 4, "finished": 4, "missing": []}

    readme = (root / "README.md").read_text()
    assert "python -m experiments.benchmark --profile tiny" in readme
    assert f"{100 * statistics.mean(favor):.2f} ± {100 * statistics.stdev(favor):.2f}" in readme
    for name in ("pareto_mnist.png", "curves_mnist.png", "saliency_mnist.png"):
        assert (root / name).stat().st_size > 1000, name
    assert "tf-keras-vis SmoothGrad" in readme or "plain input gradient" in readme
    assert len(result["commits"]) == 1 and "Code version: every finished run was trained by commit" in readme
    # A run resumed by other code: the report says the table mixes code versions.
    provenance = root / "runs/mnist/favor-absolute/seed1/provenance.json"
    sessions = json.loads(provenance.read_text())["sessions"]
    sessions.append({"commit": "0" * 40, "start_epoch": 1, "keras_backend": "tensorflow"})
    provenance.write_text(json.dumps({"sessions": sessions}))
    assert report.main(["--profile", "tiny", "--results-dir", str(tmp_path)]) == 0
    assert "so this table mixes code versions" in (root / "README.md").read_text()


def test_pilot_summary_by_hand(tmp_path, capsys):
    from experiments import pilots

    # Setting d16, seeds 0 and 1: best validation accuracy per run, 2 epochs of 900 s = 0.5 h each.
    best = {"softmax-absolute": (0.60, 0.62), "favor-absolute": (0.57, 0.60), "relu-absolute": (0.55, 0.56)}
    for variant, values in best.items():
        for seed, value in enumerate(values):
            folder = tmp_path / "cpu-pilots" / "d16" / "runs" / "cifar10" / variant / f"seed{seed}"
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps(RunConfig(variant=variant, seed=seed, heads=4).to_dict()))
            (folder / "metrics.json").write_text("{}")
            (folder / "history.csv").write_text(
                f"epoch,epoch_seconds,val_accuracy\n0,900,{value - 0.1}\n1,900,{value}\n")
    assert pilots.main(["--results-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "cpu-pilots" / "pilots.json").read_text())["pilots"][0]
    # favor: softmax - favor = 0.03, 0.02 -> mean 0.025; per CPU hour of both runs (1 h): 0.025.
    favor = summary["gaps"]["favor-absolute"]
    assert favor["mean"] == pytest.approx(0.025) and favor["gap_per_cpu_hour"] == pytest.approx(0.025)
    assert summary["gaps"]["relu-absolute"]["mean"] == pytest.approx(0.055)
    assert summary["variants"]["softmax-absolute"]["hours_per_run"] == pytest.approx(0.5)
    assert "| d16 | (the first) | relu-absolute | 55.50 (2) | +5.50" in (tmp_path / "cpu-pilots" / "README.md").read_text()
    # A cell that is no number ended the summary in a traceback (could not convert string to float).
    with open(folder / "history.csv", "a") as f:
        f.write("2,abc,0.9\n")
    capsys.readouterr()
    assert pilots.main(["--results-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"pilots: error: {folder / 'history.csv'}, line 4, is no epoch's row"
    # So did a config.json that is no JSON object ('list' object has no attribute 'items').
    (folder / "history.csv").write_text("epoch,epoch_seconds,val_accuracy\n0,900,0.5\n")
    first = tmp_path / "cpu-pilots" / "d16" / "runs" / "cifar10" / "favor-absolute" / "seed0"
    (first / "config.json").write_text("[1]")
    assert pilots.main(["--results-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"pilots: error: {first / 'config.json'} holds a JSON list, not an object"
    # A config.json of the wrong keys was read as the run's settings, into the README's "settings that differ".
    (first / "config.json").write_text(json.dumps({"heads": 4, "colour": "red"}))
    assert pilots.main(["--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"pilots: error: {first / 'config.json'} describes no run (lacks ['absolute_position', 'batch_size', ")
    assert err.endswith("; unknown keys ['colour'])") and "\n" not in err
    # A finished run without a validated epoch ended in `max() arg is an empty sequence`, naming no file.
    (first / "config.json").write_text(json.dumps(RunConfig(variant="favor-absolute", seed=0, heads=4).to_dict()))
    (first / "history.csv").write_text("epoch,epoch_seconds,val_accuracy\n0,900,\n")
    assert pilots.main(["--results-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"pilots: error: {first / 'history.csv'} has no epoch with a validation "
                                               "accuracy, yet the run finished")


def test_variants_all_expands_to_the_twelve_of_the_comparison_and_selects_their_runs_of_the_queue(tmp_path):
    from experiments.cli import expand_variants
    from performer_keras.registry import list_variants

    twelve = list_variants()
    assert expand_variants(["all"]) == twelve
    # Named beside 'all', an extra row joins the twelve; repeats go, the order stays.
    assert expand_variants(["exp-rope", "all", "favor-rope", "exp-rope"]) == ["exp-rope", *twelve]
    assert expand_variants(None) is None and expand_variants([], ["x"]) == ["x"]
    profile = get_profile("cpu")
    args = benchmark.parser("benchmark", "", *benchmark.SELECTION_OPTIONS).parse_args(
        ["--profile", "cpu", "--variants", "all", "--results-dir", str(tmp_path)])
    jobs = benchmark.selected_jobs(args, profile)
    assert jobs == benchmark.plan(profile, tmp_path, variants=twelve)
    # The profile's extra rows (exp) are not among the twelve.
    assert {j.variant for j in jobs} == set(twelve) & {j.variant for j in benchmark.plan(profile, tmp_path)}
