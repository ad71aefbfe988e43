"""Bad input to each of the tools (train, evaluate, benchmark, report, tuning and its sweep, profiles and its
engine, precision and XLA benchmarks): exit 2, exactly one line on stderr, no traceback, nothing written.

Every case runs the tool's `main(argv)` in this process inside a folder whose
every file is checksummed before and after: a refused command must leave the
folder exactly as it was (no run folder, no config.json, no changed file).
"""

import hashlib
import json
import logging
import os
import re
from pathlib import Path

import keras
import pytest

import evaluate
import train
from experiments import benchmark, report
from experiments.run_config import RunConfig
from profiles import __main__ as profiles_main
from profiles import engine, precision, xla_cost
from profiles.bench import device_slug
from tuning import __main__ as tuning_main
from tuning import sweep

TINY = ["--size", "tiny", "--limit", "300", "--batch-size", "32", "--epochs", "1"]


def files(tmp):
    (tmp / "a_file.txt").write_text("not a folder\n")
    (tmp / "lr_string.json").write_text(json.dumps({"learning_rate": "0.001"}))
    (tmp / "wd_string.json").write_text(json.dumps({"weight_decay": "abc"}))
    (tmp / "qknorm_string.json").write_text(json.dumps({"normalize_qk": "no"}))  # truthy: it switched normalising on
    (tmp / "broken.json").write_text("{")
    (tmp / "dataset_empty.json").write_text(json.dumps({"dataset": ""}))
    (tmp / "dataset_number.json").write_text(json.dumps({"dataset": 10}))
    run = tmp / "corrupt_run"
    run.mkdir()
    (run / "config.json").write_text("{")
    (run / "best.keras").write_bytes(b"")
    (tmp / "bogus.keras").write_bytes(b"not a zip")
    listed = tmp / "list_run"  # a run folder whose config.json was overwritten by hand with valid JSON, not an object
    listed.mkdir()
    (listed / "config.json").write_text("[1]")
    (listed / "best.keras").write_bytes(b"")
    mistyped = tmp / "mistyped_run"  # a hand edit: the limit ended in a traceback, limit_test "no" counted as true
    mistyped.mkdir()
    (mistyped / "config.json").write_text(json.dumps({**RunConfig(dataset="mnist").to_dict(), "limit": "x"}))
    (mistyped / "best.keras").write_bytes(b"")
    broken_export = tmp / "broken_export"
    broken_export.mkdir()
    (broken_export / "saved_model.pb").write_bytes(b"")
    (broken_export / "export_of.json").write_text("{")
    other_export = tmp / "other_export"
    other_export.mkdir()
    (other_export / "saved_model.pb").write_bytes(b"")
    (other_export / "export_of.json").write_text(json.dumps({"run": "/elsewhere/run"}))
    damaged = tmp / "damaged_history_run"
    damaged.mkdir()
    (damaged / "config.json").write_text(json.dumps(RunConfig(dataset="mnist").to_dict()))
    (damaged / "best.keras").write_bytes(b"")
    (damaged / "history.csv").write_text("epoch,epoch_seconds,val_accuracy\n0,abc,0.5\n")
    for name in ("finished_run", "training_run"):  # a run folder's metrics.json is its result and its end mark
        (tmp / name / "export").mkdir(parents=True)
        (tmp / name / "config.json").write_text(json.dumps(RunConfig(dataset="mnist").to_dict()))
        (tmp / name / "best.keras").write_bytes(b"")
        (tmp / name / "export" / "saved_model.pb").write_bytes(b"")
    (tmp / "finished_run" / "metrics.json").write_text(json.dumps({"test_accuracy": 0.9}))
    (tmp / "training_run" / "backup").mkdir()
    measured = tmp / "measured" / device_slug() / keras.backend.backend()  # profiles' results, damaged by hand
    (measured / "bench").mkdir(parents=True)
    (measured / "run.json").write_text(json.dumps({"runs": []}))
    (measured / "bench" / "softmax-absolute-mnist.json").write_text("[1]")
    keyless = tmp / "keyless_profile" / device_slug() / keras.backend.backend()  # valid JSON, not a bench record
    (keyless / "bench").mkdir(parents=True)
    (keyless / "bench" / "softmax-absolute-mnist.json").write_text(json.dumps({"variant": "softmax-absolute"}))
    (tmp / "unlisted" / device_slug() / keras.backend.backend()).mkdir(parents=True)
    (tmp / "unlisted" / device_slug() / keras.backend.backend() / "run.json").write_text("{")
    (tmp / "notes").mkdir()
    (tmp / "notes" / "todo.txt").write_text("mine\n")
    (tmp / "results" / "tiny").mkdir(parents=True)  # a profile's folder, before its first run ends
    (tmp / "sections" / "tiny").mkdir(parents=True)
    (tmp / "sections" / "small").mkdir()
    (tmp / "sections" / "small" / "aggregate.json").write_text("{")  # another profile's report, damaged by hand
    (tmp / "keyless" / "tiny").mkdir(parents=True)
    (tmp / "keyless" / "small").mkdir()
    (tmp / "keyless" / "small" / "aggregate.json").write_text(json.dumps({"profile": "small"}))  # valid JSON, no row


CASES = {
    # train.py: argparse types, ranges, finiteness, combinations, files.
    "train --epochs 1.5": (train.main, [*TINY, "--epochs", "1.5"], "--epochs"),
    "train --epochs 0": (train.main, [*TINY, "--epochs", "0"], "--epochs"),
    "train --batch-size -3": (train.main, [*TINY, "--batch-size", "-3"], "--batch-size"),
    "train --seed -1": (train.main, [*TINY, "--seed", "-1"], "--seed"),
    "train --seed 2**32": (train.main, [*TINY, "--seed", str(2**32)], "from 0 to 4294967295"),
    "train --learning-rate inf": (train.main, [*TINY, "--learning-rate", "inf"], "--learning-rate"),
    "train --learning-rate nan": (train.main, [*TINY, "--learning-rate", "nan"], "--learning-rate"),
    "train --learning-rate 0": (train.main, [*TINY, "--learning-rate", "0"], "learning_rate"),
    "train --learning-rate abc": (train.main, [*TINY, "--learning-rate", "abc"], "--learning-rate"),
    "train --weight-decay -0.1": (train.main, [*TINY, "--weight-decay", "-0.1"], "weight_decay"),
    "train --dropout 1": (train.main, [*TINY, "--dropout", "1"], "dropout must be < 1"),
    "train --label-smoothing -0.1": (train.main, [*TINY, "--label-smoothing", "-0.1"], "label_smoothing"),
    "train linformer-kerple": (train.main, [*TINY, "--variant", "linformer-kerple"], "linformer-kerple"),
    "train unknown position": (train.main, [*TINY, "--variant", "favor-nope"], "Unknown position"),
    "train unknown kernel": (train.main, [*TINY, "--variant", "magic-rope"], "Unknown attention"),
    "train --width 15": (train.main, [*TINY, "--size", "small", "--width", "15"], "divisible"),
    "train --patch-size 5": (train.main, [*TINY, "--patch-size", "5"], "patch_size 5"),
    "train batch above data": (train.main, [*TINY, "--batch-size", "100000"], "exceeds"),
    "train hparams lr string": (train.main, [*TINY, "--hparams", "{tmp}/lr_string.json"], "learning_rate"),
    "train hparams wd string": (train.main, [*TINY, "--hparams", "{tmp}/wd_string.json"], "weight_decay"),
    "train hparams normalize_qk a string": (train.main, [*TINY, "--hparams", "{tmp}/qknorm_string.json"],
                                            "normalize_qk must be True or False or None, got 'no'"),
    "train hparams dataset empty": (train.main, [*TINY, "--hparams", "{tmp}/dataset_empty.json"],
                                    "dataset must be a name or path, got ''"),
    "train hparams dataset a number": (train.main, [*TINY, "--hparams", "{tmp}/dataset_number.json"],
                                       "dataset must be a name or path, got 10"),
    "train hparams missing": (train.main, [*TINY, "--hparams", "{tmp}/missing.json"], "cannot read --hparams"),
    "train hparams not json": (train.main, [*TINY, "--hparams", "{tmp}/broken.json"], "cannot read --hparams"),
    "train --out a file": (train.main, [*TINY, "--out", "{tmp}/a_file.txt"], "is a file"),
    "train --out under a file": (train.main, [*TINY, "--out", "{tmp}/a_file.txt/run/x"], "a_file.txt, a file"),
    "train --out where no folder can be made": (train.main, [*TINY, "--out", "/proc/performer-keras/run"], "no folder can be made in /proc"),
    "train --export a file": (train.main, [*TINY, "--out", "{tmp}/run", "--export", "{tmp}/a_file.txt"], "is a file"),
    "train --export another run's export": (train.main, [*TINY, "--out", "{tmp}/run", "--export", "{tmp}/other_export"],
                                            "an export of /elsewhere/run"),
    # These three ended in a traceback (AttributeError: 'list' object has no attribute 'get'; a JSONDecodeError).
    "train --out a run whose config is a list": (train.main, [*TINY, "--out", "{tmp}/list_run"],
                                                 "list_run/config.json holds a JSON list, not an object"),
    # Each was exported into the run's own files; into backup/, a rerun with --export trained the run again.
    "train --export into its run folder": (train.main, [*TINY, "--out", "{tmp}/run", "--export", "{tmp}/run"],
                                           "holds the run folder"),
    "train --export into its backup": (train.main, [*TINY, "--out", "{tmp}/run", "--export", "{tmp}/run/backup"],
                                       "/run/backup is inside the run folder"),
    "train --export above its run folder": (train.main, [*TINY, "--out", "{tmp}/new/run", "--export", "{tmp}/new"],
                                            "holds the run folder"),
    "train --export whose record does not read": (train.main, [*TINY, "--out", "{tmp}/run", "--export", "{tmp}/broken_export"],
                                                  "broken_export/export_of.json is not valid JSON"),
    "train --export a folder of other files": (train.main, [*TINY, "--out", "{tmp}/run", "--export", "{tmp}/notes"],
                                               "no export of this run"),
    "train --init-from missing": (train.main, [*TINY, "--init-from", "{tmp}/none.keras"],
                                  "none.keras: no such file or folder"),
    "train --init-from a folder without best.keras": (train.main, [*TINY, "--init-from", "{tmp}/notes"], "a folder without best.keras"),
    "train --init-from not a model": (train.main, [*TINY, "--init-from", "{tmp}/bogus.keras"], "cannot read --init-from"),
    "train --init-from-partial without --init-from": (train.main, [*TINY, "--init-from-partial"],
                                                      "--init-from-partial changes nothing without --init-from"),
    "train --precision float8": (train.main, [*TINY, "--precision", "float8"], "Unknown precision"),
    "train --limit 0": (train.main, [*TINY, "--limit", "0"], "--limit"),
    "train --limit abc": (train.main, [*TINY, "--limit", "abc"], "--limit"),
    "train --num-features 0": (train.main, [*TINY, "--num-features", "0"], "--num-features"),
    "train --redraw-interval -1": (train.main, [*TINY, "--redraw-interval", "-1"], "--redraw-interval"),
    "train --size huge": (train.main, [*TINY, "--size", "huge"], "Unknown size"),
    "train variant twice": (train.main, [*TINY, "--variant", "favor-rope", "--attention", "relu"], "not both"),
    "train unknown flag": (train.main, [*TINY, "--no-such-flag"], "unrecognized arguments"),
    "train --rotation-order middle": (train.main, [*TINY, "--variant", "favor-rope", "--rotation-order", "middle"],
                                      "Unknown rotation_order"),
    "train rope on a head width of 3": (train.main, [*TINY, "--variant", "favor-rope", "--width", "18", "--heads", "6"],
                                        "divisible by 4"),
    "train unknown dataset": (train.main, [*TINY, "--dataset", "no_such_dataset_xyz"], "mnist"),
    "train --qk-norm without normalised q and k": (train.main, [*TINY, "--qk-norm", "0.5"],
                                                   "--qk-norm changes nothing in softmax-absolute"),
    "train --rotation-order without a rotation": (train.main, [*TINY, "--variant", "favor-absolute", "--rotation-order",
                                                               "after"], "--rotation-order changes nothing"),
    "train --num-features for deterministic relu": (train.main, [*TINY, "--variant", "relu-absolute", "--deterministic",
                                                                 "--num-features", "8"], "relu without deterministic"),
    "train --stabilizer for softmax": (train.main, [*TINY, "--stabilizer", "exponent"],
                                       "--stabilizer changes nothing in softmax-absolute; it applies to favor"),
    "train --stabilizer unknown": (train.main, [*TINY, "--variant", "favor-absolute", "--stabilizer", "max"],
                                   "Unknown stabilizer 'max'"),
    "train --out an empty string": (train.main, [*TINY, "--out", ""], "empty string"),
    "train --keep-epochs 0": (train.main, [*TINY, "--keep-epochs", "0"], "--keep-epochs"),
    "train --keep-epochs past the run": (train.main, [*TINY, "--keep-epochs", "1", "3", "2"],
                                         "--keep-epochs 2 3: the run has 1 epoch"),
    "train --dataset an empty string": (train.main, [*TINY, "--dataset", ""], "empty string"),
    # evaluate.py
    "evaluate missing path": (evaluate.main, ["{tmp}/missing"], "does not exist"),
    "evaluate a text file": (evaluate.main, ["{tmp}/a_file.txt"], "evaluate.py: error"),
    "evaluate corrupt config": (evaluate.main, ["{tmp}/corrupt_run"], "not valid JSON"),
    "evaluate a run whose config is a list": (evaluate.main, ["{tmp}/list_run"], "config.json holds a JSON list, not an object"),
    "evaluate a run whose config holds a value no run has": (evaluate.main, ["{tmp}/mistyped_run"],
                                                              "config.json describes no run (limit must be an integer"),
    "evaluate --limit 0": (evaluate.main, ["{tmp}/corrupt_run", "--limit", "0"], "--limit"),
    "evaluate --batch-size x": (evaluate.main, ["{tmp}/corrupt_run", "--batch-size", "x"], "--batch-size"),
    "evaluate --out a file": (evaluate.main, ["{tmp}/corrupt_run", "--out", "{tmp}/a_file.txt"], "is a file"),
    "evaluate --out under a file": (evaluate.main, ["{tmp}/corrupt_run", "--out", "{tmp}/a_file.txt/eval"], "a file"),
    "evaluate --out where no folder can be made": (evaluate.main, ["{tmp}/corrupt_run", "--out", "/proc/performer-keras"], "no folder can be made"),
    "evaluate a damaged SavedModel": (evaluate.main, ["{tmp}/other_export", "--dataset", "mnist"], "as a SavedModel"),
    "evaluate bogus .keras": (evaluate.main, ["{tmp}/bogus.keras", "--dataset", "mnist"],
                              "bogus.keras is no .keras file (not a zip archive: damaged, or another format)"),
    "evaluate a run whose history.csv does not read": (evaluate.main, ["{tmp}/damaged_history_run"],
                                                       "history.csv, line 2, is no epoch's row"),
    "evaluate an empty path": (evaluate.main, [""], "empty string"),
    # Each wrote metrics.json into a run folder: over a finished run's result, or marking a training run finished.
    "evaluate a run's best.keras into its run folder": (evaluate.main, ["{tmp}/finished_run/best.keras", "--dataset", "mnist"],
                                                        "finished_run is a run folder: evaluating"),
    "evaluate a run's export into its run folder": (evaluate.main, ["{tmp}/finished_run/export", "--dataset", "mnist"],
                                                    "would overwrite its metrics.json; give --out DIR"),
    "evaluate --out another run's folder": (evaluate.main, ["{tmp}/bogus.keras", "--dataset", "mnist", "--out",
                                                            "{tmp}/training_run"], "training_run is a run folder"),
    "evaluate a run still training": (evaluate.main, ["{tmp}/training_run"], "is still training (backup/ holds its state)"),
    "evaluate a finished run on other data, --out itself": (
        evaluate.main, ["{tmp}/finished_run", "--limit", "50", "--out", "{tmp}/finished_run"],
        "is a finished run measured on its own test split"),
    # the benchmark
    "train --distribute data on TF": (train.main, [*TINY, "--distribute", "data", "--out", "{tmp}/run"], "KERAS_BACKEND=jax"),
    "train --distribute model": (train.main, [*TINY, "--distribute", "model", "--out", "{tmp}/run"], "--distribute"),
    "benchmark --profile huge": (benchmark.main, ["--profile", "huge", "--results-dir", "{tmp}/results"], "huge"),
    "benchmark --epochs 0": (benchmark.main, ["--profile", "tiny", "--epochs", "0", "--results-dir", "{tmp}/r"], "--epochs"),
    "benchmark --max-runs -1": (benchmark.main, ["--profile", "tiny", "--max-runs", "-1", "--results-dir", "{tmp}/r"], "--max-runs"),
    "benchmark --max-minutes 0": (benchmark.main, ["--profile", "tiny", "--max-minutes", "0", "--results-dir", "{tmp}/r"], "--max-minutes"),
    "benchmark --archive not .tar.gz": (benchmark.main, ["--profile", "tiny", "--archive", "{tmp}/runs.zip", "--results-dir", "{tmp}/r"], "--archive"),
    "benchmark --archive in a missing folder": (benchmark.main, ["--profile", "tiny", "--archive", "{tmp}/no/runs.tar.gz", "--results-dir", "{tmp}/r"], "folder does not exist"),
    "benchmark --archive where no file can be made": (benchmark.main, ["--profile", "tiny", "--archive", "/proc/runs.tar.gz", "--results-dir", "{tmp}/r"],
                                                      "no file can be made in /proc"),
    "benchmark --shard 2/2": (benchmark.main, ["--profile", "tiny", "--shard", "2/2", "--results-dir", "{tmp}/r"], "--shard"),
    # --list prints the queue: it read none of these, and printed it as if they changed it.
    "benchmark --list --workers 2": (benchmark.main, ["--profile", "tiny", "--list", "--workers", "2", "--results-dir", "{tmp}/r"],
                                     "--workers changes nothing with --list"),
    "benchmark --list --max-minutes": (benchmark.main, ["--profile", "tiny", "--list", "--max-minutes", "30", "--results-dir",
                                                        "{tmp}/r"], "--max-minutes changes nothing with --list"),
    "benchmark --workers with --shard": (benchmark.main, ["--profile", "tiny", "--workers", "2", "--shard", "0/2", "--results-dir", "{tmp}/r"], "exclude"),
    "benchmark --keep-epochs past the runs": (benchmark.main, ["--profile", "tiny", "--keep-epochs", "1", "999",
                                                                "--results-dir", "{tmp}/r"],
                                              "--keep-epochs 999: a mnist run of profile 'tiny' has"),
    "benchmark --seeds x": (benchmark.main, ["--profile", "tiny", "--seeds", "x", "--results-dir", "{tmp}/r"], "--seeds"),
    "benchmark --seeds 2**32": (benchmark.main, ["--profile", "tiny", "--seeds", "0", str(2**32), "--results-dir", "{tmp}/r"], "--seeds"),
    "benchmark --experiments nope": (benchmark.main, ["--profile", "tiny", "--experiments", "nope", "--results-dir", "{tmp}/r"], "experiment"),
    "benchmark --results-dir a file": (benchmark.main, ["--profile", "tiny", "--results-dir", "{tmp}/a_file.txt"], "is a file"),
    "benchmark --results-dir under a file": (benchmark.main, ["--profile", "tiny", "--results-dir", "{tmp}/a_file.txt/r"], "a file"),
    "benchmark --results-dir where no folder can be made": (benchmark.main, ["--profile", "tiny", "--results-dir", "/proc/performer-keras"], "no folder can be made"),
    "benchmark other backend": (benchmark.main, ["--profile", "small", "--results-dir", "{tmp}/r"], "backend"),
    "benchmark an ablation the profile lacks": (benchmark.main, ["--profile", "cpu", "--experiments", "learning_rate", "--results-dir", "{tmp}/r"], "has no learning_rate experiment"),
    "benchmark an ablation elsewhere": (benchmark.main, ["--profile", "reference", "--experiments", "learning_rate", "--datasets", "cifar10", "--results-dir", "{tmp}/r"], "runs favor-absolute, softmax-absolute on mnist"),
    "report an ablation the profile lacks": (report.main, ["--profile", "small", "--experiments", "normalize_qk", "--results-dir", "{tmp}/r"], "has no normalize_qk experiment"),
    "report --results-dir a file": (report.main, ["--profile", "tiny", "--results-dir", "{tmp}/a_file.txt"], "is a file"),
    "report --results-dir under a file": (report.main, ["--profile", "tiny", "--results-dir", "{tmp}/a_file.txt/r"], "a file"),
    "report --results-dir where no folder can be made": (report.main, ["--profile", "tiny", "--results-dir", "/proc/performer-keras"], "no folder can be made"),
    "benchmark --results-dir an empty string": (benchmark.main, ["--profile", "tiny", "--results-dir", ""], "empty string"),
    "report on a results folder without the profile": (report.main, ["--profile", "tiny", "--results-dir", "{tmp}/r"],
                                                        "r/tiny does not exist: no run of profile 'tiny' to report"),
    "report beside another profile's damaged aggregate.json": (  # a traceback after this profile's report
        report.main, ["--profile", "tiny", "--results-dir", "{tmp}/sections"],
        "small/aggregate.json is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1)); `python -m experiments.report --profile small` writes it again"),
    "report beside another profile's aggregate.json without its keys": (  # a KeyError after this profile's report
        report.main, ["--profile", "tiny", "--results-dir", "{tmp}/keyless"],
        "small/aggregate.json is not a benchmark's aggregate (KeyError('settings')); `python -m experiments.report "
        "--profile small` writes it again"),
    "report --profile huge": (report.main, ["--profile", "huge", "--results-dir", "{tmp}/r"], "huge"),
    # --variants is checked as it is parsed, by every tool that takes it: the profiles met a misspelt name only
    # after minutes of measuring the others, the benchmark and report once they had planned the queue.
    "benchmark unknown variant": (benchmark.main, ["--profile", "tiny", "--variants", "favor-nope", "--results-dir", "{tmp}/r"],
                                  "argument --variants: unknown variant 'favor-nope'; expected 'all' or one of"),
    "benchmark linformer-kerple": (benchmark.main, ["--profile", "tiny", "--variants", "linformer-kerple", "--results-dir",
                                                    "{tmp}/r"], "unknown variant 'linformer-kerple'"),
    "report unknown variant": (report.main, ["--profile", "tiny", "--variants", "favor-nope", "--results-dir", "{tmp}/r"],
                               "unknown variant 'favor-nope'"),
    "sweep unknown variant": (sweep.main, ["--variants", "favor-rope", "bogus-rope", "--out", "{tmp}/t"],
                              "unknown variant 'bogus-rope'"),
    "precision unknown variant": (precision.main, ["favor-nope", "--out", "{tmp}/p"], "unknown variant 'favor-nope'"),
    "xla_cost unknown variant": (xla_cost.main, ["--variants", "favor-nope", "--out", "{tmp}/p"],
                                 "unknown variant 'favor-nope'"),
    "xla_cost unknown dataset": (xla_cost.main, ["--datasets", "mnist", "no_such_dataset_xyz", "--out", "{tmp}/p"],
                                 "python -m profiles.xla_cost: error: Could not load dataset 'no_such_dataset_xyz'"),
    # tuning
    "tuning --out a file": (tuning_main.main, ["favor-rope", "--out", "{tmp}/a_file.txt"], "is a file"),
    "tuning --out under a file": (tuning_main.main, ["favor-rope", "--out", "{tmp}/a_file.txt/t"], "a file"),
    "tuning --out where no folder can be made": (tuning_main.main, ["favor-rope", "--out", "/proc/performer-keras"], "no folder can be made"),
    "tuning unknown variant": (tuning_main.main, ["favor-nope", "--out", "{tmp}/t"], "Unknown position"),
    "tuning --algorithm magic": (tuning_main.main, ["favor-rope", "--algorithm", "magic", "--out", "{tmp}/t"], "algorithm"),
    "tuning --space bad": (tuning_main.main, ["favor-rope", "--space", "learning_rate=abc", "--out", "{tmp}/t"], "learning_rate"),
    "tuning --space-file an empty string": (tuning_main.main, ["favor-rope", "--space-file", "", "--out", "{tmp}/t"], "empty string"),
    "tuning no variant": (tuning_main.main, ["--out", "{tmp}/t"], "VARIANT"),
    # profiles
    "profiles --size huge": (profiles_main.main, ["--size", "huge", "--out", "{tmp}/p", "--skip-scaling"], "huge"),
    "profiles unknown variant": (profiles_main.main, ["favor-nope", "--out", "{tmp}/p"], "unknown variant 'favor-nope'"),
    "profiles --out a file": (profiles_main.main, ["--out", "{tmp}/a_file.txt"], "is a file"),
    "profiles --out under a file": (profiles_main.main, ["--out", "{tmp}/a_file.txt/p"], "a file"),
    "profiles --out where no folder can be made": (profiles_main.main, ["--out", "/proc/performer-keras"], "no folder can be made"),
    "profiles --width 30 --heads 4": (profiles_main.main, ["--width", "30", "--heads", "4", "--out", "{tmp}/p"], "divisible"),
    "profiles --steps 0": (profiles_main.main, ["--steps", "0", "--out", "{tmp}/p"], "--steps"),
    # Each was accepted and changed nothing (the bench ignored --width; --model-tokens needs the model scope), or
    # measured a sweep of failed points and exited 0 (its shape was checked against the bench's model).
    "profiles --width with --skip-scaling": (profiles_main.main, ["--width", "64", "--skip-scaling", "--out", "{tmp}/p"],
                                             "--width changes nothing with --skip-scaling; it applies to the scaling sweep"),
    "profiles --size with --skip-bench": (profiles_main.main, ["--size", "small", "--skip-bench", "--out", "{tmp}/p"],
                                          "--size changes nothing with --skip-bench; it applies to the per-variant bench"),
    "profiles --model-tokens without the model scope": (
        profiles_main.main, ["--model-tokens", "64", "--scopes", "layer", "--out", "{tmp}/p"],
        "--model-tokens changes nothing without the model scope in --scopes"),
    "profiles --fused-softmax without softmax": (profiles_main.main, ["favor-rope", "--fused-softmax", "--out", "{tmp}/p"],
                                                 "--fused-softmax changes nothing without a softmax variant"),
    "profiles --report-only with a variant": (profiles_main.main, ["favor-rope", "--report-only", "--out", "{tmp}/p"],
                                              "VARIANT changes nothing with --report-only"),
    "profiles a sweep shape rope cannot take": (
        profiles_main.main, ["favor-rope", "--heads", "64", "--skip-bench", "--tokens", "16", "--out", "{tmp}/p"],
        "the scaling sweep cannot build favor-rope: "),
    "profiles --skip-bench --skip-scaling": (profiles_main.main, ["--skip-bench", "--skip-scaling", "--out", "{tmp}/p"],
                                            "--skip-bench and --skip-scaling together leave nothing to measure"),
    "profiles --report-only with nothing measured": (profiles_main.main, ["--report-only", "--out", "{tmp}/p"],
                                                     "holds no profile results to summarise"),
    # Both a traceback: at once, or after the measurements (the summary read every record there).
    "profiles --report-only over a damaged record": (profiles_main.main, ["--report-only", "--out", "{tmp}/measured"],
                                                     "softmax-absolute-mnist.json holds a JSON list, not an object"),
    "profiles --report-only over a record without its keys": (profiles_main.main, ["--report-only", "--out",
                                                                                "{tmp}/keyless_profile"],
                                                              "do not make a summary (KeyError("),
    "profiles over a damaged run.json": (profiles_main.main, ["--skip-scaling", "--out", "{tmp}/unlisted"],
                                         "run.json is not valid JSON"),
    # profiles.engine
    "engine --baseline missing": (engine.main, ["--baseline", "{tmp}/old-checkout", "--out", "{tmp}/e"],
                                  "is not a checkout of this project"),
    "engine --baseline not a checkout": (engine.main, ["--baseline", "{tmp}/notes", "--out", "{tmp}/e"],
                                         "is not a checkout of this project"),
    "engine --rounds 0": (engine.main, ["--rounds", "0", "--out", "{tmp}/e"], "--rounds"),
    "engine --size huge": (engine.main, ["--size", "huge", "--out", "{tmp}/e"], "Unknown size 'huge'"),
    "engine --precision float8": (engine.main, ["--precision", "float8", "--out", "{tmp}/e"], "Unknown precision"),
    "engine unknown dataset": (engine.main, ["--dataset", "no_such_dataset_xyz", "--out", "{tmp}/e"], "mnist"),
    "engine --worker-counts 1": (engine.main, ["--worker-counts", "1", "2", "--out", "{tmp}/e"],
                                 "--worker-counts 1: every record times one run already"),
    "engine --out a file": (engine.main, ["--out", "{tmp}/a_file.txt"], "is a file"),
}


def checksums(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_the_table_covers_all_ten_tools_with_40_or_more_inputs():
    tools = {main for main, _, _ in CASES.values()}
    assert len(CASES) >= 40 and len(tools) == 10
    # The README's count was left behind once (113 where the table held 124).
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert f"checks {len(CASES)} bad inputs across {len(tools)} tools" in readme


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_in_one_line_and_writes_nothing(case, tmp_path, capsys, monkeypatch):
    main, argv, expected = CASES[case]
    files(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = checksums(tmp_path)
    capsys.readouterr()
    try:
        code = main([arg.replace("{tmp}", str(tmp_path)) for arg in argv])
    except SystemExit as exit:  # argparse's own exit
        code = exit.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert expected in lines[0], lines[0]
    assert checksums(tmp_path) == before, f"{case} changed {os.listdir(tmp_path)}"


BACKEND_CASES = {
    "train": (train.main, [*TINY, "--out", "{tmp}/run"], "train.py"),
    "evaluate": (evaluate.main, ["{tmp}/corrupt_run"], "evaluate.py"),
    "benchmark": (benchmark.main, ["--profile", "tiny", "--results-dir", "{tmp}/r"], "benchmark"),
    "report": (report.main, ["--profile", "tiny", "--results-dir", "{tmp}/results"], "report"),
    "tuning": (tuning_main.main, ["favor-rope", "--out", "{tmp}/t"], "python -m tuning"),
    "profiles": (profiles_main.main, ["--skip-scaling", "--out", "{tmp}/p"], "python -m profiles"),
}


@pytest.mark.parametrize("tool", list(BACKEND_CASES))
@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_a_backend_the_project_does_not_run_on_is_refused_in_one_line_before_keras_starts(tool, backend, tmp_path,
                                                                                          capsys, monkeypatch):
    # torch is not installed, so Keras' import would end in a traceback; numpy imports and fails in the first
    # compiled step. Keras is already imported in this process: what is tested is that the tool asks first.
    main, argv, prog = BACKEND_CASES[tool]
    files(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERAS_BACKEND", backend)
    before = checksums(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main([arg.replace("{tmp}", str(tmp_path)) for arg in argv])
    assert exit.value.code == 2
    assert capsys.readouterr().err == (
        f"{prog}: error: KERAS_BACKEND={backend!r} is not one of ('tensorflow', 'jax') (unset, it is tensorflow)\n")
    assert checksums(tmp_path) == before


def test_tensorflows_start_up_log_is_told_from_what_stays():
    from experiments.cli import is_start_up_log

    # As TensorFlow 2.21 prints them on an Intel CPU, whatever TF_CPP_MIN_LOG_LEVEL says.
    dropped = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
        "I0000 00:00:1795575343.338505   13204 port.cc:153] oneDNN custom operations are on. You may see slightly "
        "different numerical results due to floating-point round-off errors.\n",
        "W0000 00:00:1795575343.338505   13204 cuda_dnn.cc:8] Unable to register cuDNN factory\n",
    ]
    kept = [
        "E0000 00:00:1795575343.338505   13204 cuda_driver.cc:152] failed call to cuInit: UNKNOWN ERROR (303)\n",
        "train.py: error: argument --epochs: expected a whole number >= 1, got '0'\n",
        "/x/keras/src/export.py:3: UserWarning: a Python warning\n",
    ]
    assert all(is_start_up_log(line) for line in dropped) and not any(is_start_up_log(line) for line in kept)


def test_tensorflows_retracing_warning_is_dropped_for_keras_step_functions_only(caplog):
    """Six models predicting once each: TensorFlow counts their predict functions as retraces of one
    function (one Python code object) and warned from the fifth on, as in a search or a benchmark.
    After `start_backend` that warning is gone, and the same warning about a function of one's own
    (six lambdas of one line, traced once each) still shows."""
    import keras
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    from experiments.cli import ONE_TRACE_PER_MODEL, start_backend

    def retracing_warnings(trace):
        # TensorFlow warns at most twice a function in a process: a fresh count, as a new process has.
        polymorphic_function._frequent_tracing_detector_manager = polymorphic_function._FrequentTracingDetectorManager()
        caplog.clear()
        for index in range(6):
            trace(index)
        return [record.getMessage() for record in caplog.records if "retracing" in record.getMessage()]

    def six_models(index):
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).predict(np.zeros((2, 3)), verbose=0)

    def six_functions(index):
        tf.function(lambda x: x + 1)(tf.constant(index))

    logging.getLogger("tensorflow").removeFilter(ONE_TRACE_PER_MODEL)
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        assert retracing_warnings(six_models)
        start_backend("train.py")
        assert not retracing_warnings(six_models)
        assert retracing_warnings(six_functions)


def test_out_of_memory_is_told_from_other_errors_in_a_few_words():
    import jax.errors
    import tensorflow as tf

    from experiments.cli import out_of_memory

    with pytest.raises(tf.errors.ResourceExhaustedError) as caught:  # 3.2 TB of float32, more than any machine holds
        tf.random.normal((10**11, 8))
    what = out_of_memory(caught.value)
    assert what.startswith("OOM when allocating tensor with shape[100000000000,8]") and len(what) <= 200, what
    # JAX's error, with the text its CPU client gave for the same array; raising a real one here would
    # abort the process when the failed buffer is freed (jaxlib 0.10.2: "Check failed: buffer_.IsConcrete()").
    jax_error = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 3200000000000 bytes.")
    assert out_of_memory(jax_error) == "RESOURCE_EXHAUSTED: Out of memory allocating 3200000000000 bytes."
    assert out_of_memory(MemoryError("Unable to allocate 3 TiB")) == "numpy: Unable to allocate 3 TiB"
    assert out_of_memory(ValueError("RESOURCE_EXHAUSTED: said by a value error")) is None
    assert out_of_memory(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: shapes differ")) is None


def test_a_model_too_large_for_memory_exits_4_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    # On TensorFlow, as this module runs in CI; JAX's CPU client aborts on such an allocation (see above).
    files(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = checksums(tmp_path)
    # 10^11 random features: the projection alone would take 3.2 TB.
    code = train.main([*TINY, "--variant", "favor-absolute", "--num-features", str(10**11), "--out", str(tmp_path / "run")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 4 and len(lines) == 1, lines
    assert lines[0].startswith("train.py: error: out of memory (") and "--num-features" in lines[0], lines[0]
    assert checksums(tmp_path) == before


MEMORY_ADVICE = {
    "train": (train.main, []),
    "evaluate": (evaluate.main, ["a_run"]),
    "benchmark": (benchmark.main, []),
    "tuning": (tuning_main.main, ["favor-absolute"]),
    "sweep": (sweep.main, ["--variants", "favor-absolute"]),
    "profiles": (profiles_main.main, []),
}


@pytest.mark.parametrize("tool", MEMORY_ADVICE)
def test_the_out_of_memory_line_names_only_options_the_tool_has(tool, tmp_path, capsys, monkeypatch):
    from experiments import cli

    main, argv = MEMORY_ADVICE[tool]
    with pytest.raises(SystemExit):
        main(["--help"])
    options = set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out))

    def no_memory(prog):
        raise MemoryError("Unable to allocate 3 TiB")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "start_backend", no_memory)
    assert main(argv) == 4
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "out of memory (numpy: Unable to allocate 3 TiB)" in lines[0], lines
    advice = re.findall(r"--[a-z][a-z-]*", lines[0].split("what was finished is kept:")[1])
    assert advice and set(advice) <= options, (advice, sorted(options))


def test_any_other_error_still_reaches_the_user_as_a_traceback():
    from experiments.cli import interruptible

    def broken():
        raise RuntimeError("a bug, not a resource")

    with pytest.raises(RuntimeError, match="a bug"):
        interruptible("tool", broken)


def test_a_folder_this_user_cannot_write_in_is_refused_before_any_work(tmp_path, monkeypatch):
    import argparse

    from experiments.cli import folder_arg

    assert folder_arg(str(tmp_path / "new" / "deeper")) == str(tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == [], "the check leaves nothing behind"
    # /proc takes no folders, even from root (CI, this machine), for whom access() grants every write.
    with pytest.raises(argparse.ArgumentTypeError, match=r"cannot be written: no folder can be made in /proc \("):
        folder_arg("/proc/performer-keras/run")


def test_a_run_config_refuses_a_seed_keras_cannot_take():
    from performer_keras.options import MAX_SEED
    from experiments.run_config import RunConfig

    assert RunConfig(seed=MAX_SEED).seed == MAX_SEED
    with pytest.raises(ValueError, match="seed must be an integer from 0 to 4294967295"):
        RunConfig(seed=MAX_SEED + 1)
