"""Tests of profiles/: the records the profiler writes, the child-process limits,
exponent fits and crossovers, and the summary.

The end-to-end test runs the command line in this process (`--in-process`) on
a tiny ViT and a narrow attention layer at two token counts, then reads the
JSON files back, as a user of the results would.
"""

import json
import shutil
import statistics
import os
import subprocess
import sys
import threading
from pathlib import Path

import keras
import pytest

from experiments import atomic, latency
from experiments.flops import analytic_model_flops
from profiles import bench, report, scaling, traces
from profiles.__main__ import main

REPO = Path(__file__).resolve().parent.parent
# Every per-variant field the issue asks for, each a positive number.
BENCH_POSITIVE = (
    "params", "tokens", "batch_size", "train_step_ms", "train_images_per_s", "latency_ms_batch1",
    "latency_ms_batch256", "train_flops_per_image", "inference_flops_per_image", "analytic_flops_per_image",
    "peak_memory_bytes", "inference_peak_memory_bytes",
)
POINT_POSITIVE = {"forward": ("ms", "peak_bytes", "flops", "analytic_flops"), "train": ("ms", "peak_bytes")}
# Width 16 keeps the N^2 D term of softmax well above the 8 N D^2 projections at N = 257.
NARROW = ["--width", "16", "--heads", "2", "--num-features", "16"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Results of `python -m profiles`: the bench of a tiny ViT, then the scaling sweep of two
    variants (plus fused softmax) in both scopes at two token counts each."""
    out = tmp_path_factory.mktemp("profiles")
    # Every measurement succeeds, so the command exits 0 (a status dict, not the string "ok").
    assert main(["favor-absolute", "favor-kerple", "--skip-scaling", "--size", "tiny", "--batch-size", "4", "--steps", "2",
          "--trace-steps", "1", "--in-process", "--out", str(out)]) == 0
    main(["softmax-absolute", "favor-absolute", "--skip-bench", "--tokens", "256", "512", "--model-tokens", "64",
          "128", "--scaling-steps", "2", "--fused-softmax", "--in-process", "--out", str(out), *NARROW])
    (result_dir,) = [p for p in out.glob("*/*") if p.is_dir()]
    return result_dir


def read(path):
    return json.loads(Path(path).read_text())


@pytest.mark.slow  # end to end runs of the measurement scripts: 10-50 s each on a 2-core CPU
def test_bench_json_has_every_field_positive(profiled):
    # A size other than the bench's default keeps its own file.
    record = read(profiled / "bench" / "favor-absolute-mnist-tiny.json")
    assert set(bench.BENCH_FIELDS) <= set(record) and record["toeplitz_path"] is None
    for field in BENCH_POSITIVE:
        assert record[field] > 0, field
    assert record["status"] == {"train": "ok", "latency_batch256": "ok"}
    assert record["backend"] == "tensorflow" and record["device"].startswith("cpu")
    assert record["xla"] is True  # as train.py trains, unless --no-jit-compile
    # Training counts forward and backward: about three forward passes.
    assert 2 < record["train_flops_per_image"] / record["inference_flops_per_image"] < 4
    # The trace is where the record says, readable by TensorBoard's profile plugin.
    assert list((profiled / record["trace_dir"]).glob("plugins/profile/*/*.xplane.pb"))
    # TensorFlow's profiler sees a step compiled with XLA as one operation on a CPU.
    (step,) = record["top_operations"]
    assert step["operation"] == "__inference_one_step_on_data" and step["self_ms"] > 0 and step["share"] == 1


@pytest.mark.slow
def test_a_bench_without_xla_ranks_tensorflow_s_own_operations(tmp_path):
    record = bench.bench_variant("favor-absolute", size="tiny", batch_size=4, steps=1, trace_steps=1,
                                 trace_dir=tmp_path, jit_compile=False)
    assert record["xla"] is False and len(record["top_operations"]) == 3
    assert all(op["self_ms"] > 0 and 0 < op["share"] < 1 for op in record["top_operations"])


@pytest.mark.slow
def test_the_bench_records_which_toeplitz_path_kerple_ran(profiled):
    assert read(profiled / "bench" / "favor-kerple-mnist-tiny.json")["toeplitz_path"] == "dense"


@pytest.mark.slow
def test_kerple_cost_times_both_positions_alternately_in_one_process():
    import keras

    from profiles import kerple_cost

    row = kerple_cost.pair("relu", "tiny", 8, "mnist", rounds=2, steps=2, num_features=8)
    assert (row["tokens"], row["toeplitz_path"]) == (17, "dense")
    for name, normalizes in (("absolute", False), ("kerple", True), ("absolute_normalized", True)):
        assert len(row[name]["ms_all"]) == 4 and row[name]["ms"] > 0
        assert row[name]["normalizes_qk"] is normalizes
    assert row["ratio"] == pytest.approx(row["kerple"]["ms"] / row["absolute"]["ms"])
    assert row["ratio_same_normalization"] == pytest.approx(row["kerple"]["ms"] / row["absolute_normalized"]["ms"])
    assert row["normalization_ratio"] == pytest.approx(row["absolute_normalized"]["ms"] / row["absolute"]["ms"])
    assert row["met"] == (row["ratio"] <= kerple_cost.TARGET)
    # Keras' default compiles with XLA on JAX only (on a CPU); --jit-compile asks for it on both.
    assert row["jit_compile"] is (keras.backend.backend() == "jax")
    assert kerple_cost.pair("relu", "tiny", 8, "mnist", rounds=1, steps=1, num_features=8, jit_compile=True)["jit_compile"]


def test_a_profile_record_says_the_command_that_made_it(tmp_path):
    import keras

    from profiles import bench

    path = bench.write_record(tmp_path, "demo", "profiles.demo", ["--out", "a b"], rows=[1, 2])
    assert path == tmp_path / bench.device_slug() / keras.backend.backend() / "demo.json"
    record = read(path)
    backend = "" if keras.backend.backend() == "tensorflow" else f"KERAS_BACKEND={keras.backend.backend()} "
    assert record["command"] == f"{backend}python -m profiles.demo --out 'a b'"
    assert record["rows"] == [1, 2] and record["backend"] == keras.backend.backend()
    assert {"date", "device", "backend_version", "keras_version"} <= set(record)
    assert record["cpu"] == latency.cpu_identity()


def test_cpu_identity_reads_the_first_processor_and_names_what_a_bare_model_name_hides(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                       "model name\t: AMD EPYC\nstepping\t: 1\ncpu MHz\t\t: 2596.152\n\n"
                       "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n\n")
    assert latency.cpu_identity(cpuinfo) == {"vendor": "AuthenticAMD", "family": "25", "model": "17",
                                             "model_name": "AMD EPYC", "stepping": "1"}
    arm = tmp_path / "arm"  # an aarch64 kernel names no model: the device name falls back to platform's
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n\n")
    assert latency.cpu_identity(arm) == {}
    assert latency.cpu_identity(tmp_path / "missing") == {}


@pytest.mark.slow
# Keras warned that it ran out of data (the pipeline had lost its length) and that it ignores shuffle=True on a
# dataset: each said the measured fit was not train.py's.
@pytest.mark.filterwarnings("error::UserWarning")
def test_xla_cost_times_the_runs_own_model_with_and_without_xla():
    from experiments import data
    from experiments.benchmark_profiles import get_profile
    from profiles import xla_cost

    splits = data.load_dataset("mnist", limit=640)  # 20 steps of 32: dispatches of 10 steps
    row = xla_cost.measure(get_profile("tiny"), "favor-absolute", splits, rounds=2, dispatches=1)
    assert (row["variant"], row["dataset"], row["batch_size"]) == ("favor-absolute", "mnist", 32)
    for mode in ("false", "true"):
        assert len(row["images_per_second"][mode]) == 2 and all(v > 0 for v in row["images_per_second"][mode])
        assert row["median"][mode] == pytest.approx(sorted(row["images_per_second"][mode])[0] / 2
                                                    + sorted(row["images_per_second"][mode])[1] / 2)
    assert row["xla_over_plain"] == pytest.approx(row["median"]["true"] / row["median"]["false"])


@pytest.mark.slow
def test_scaling_json_has_every_field_positive(profiled):
    for scope, tokens in (("layer", [257, 513]), ("model", [65, 129])):
        for series in ("softmax-absolute", "favor-absolute", "softmax-fused-absolute"):
            record = read(profiled / "scaling" / f"{scope}-{series}.json")
            assert record["backend"] == "tensorflow" and record["fused"] == ("fused" in series) and record["xla"] is True
            assert [p["tokens"] for p in record["points"]] == tokens
            for point in record["points"]:
                for mode, fields in POINT_POSITIVE.items():
                    assert point[mode]["status"] == "ok", (series, point)
                    for field in fields:
                        assert point[mode][field] > 0, (series, mode, field)


@pytest.mark.slow
@pytest.mark.parametrize("series, growth", [("softmax-absolute", 4.0), ("favor-absolute", 2.0)])
def test_flops_of_softmax_grow_4x_per_doubling_favor_2x(profiled, series, growth):
    small, large = (p["forward"]["flops"] for p in read(profiled / "scaling" / f"layer-{series}.json")["points"])
    # 257 -> 513 tokens; the linear projections keep softmax a little under 4.
    assert large / small == pytest.approx(growth, rel=0.08)


@pytest.mark.slow
def test_summary_states_crossovers_and_embeds_plots(profiled):
    summary = (profiled / "summary.md").read_text()
    assert "python -m profiles softmax-absolute favor-absolute" in summary
    assert "Measured crossover N (layer scope)" in summary and "`favor-absolute`" in summary
    for name in ("layer-time", "layer-memory", "model-time", "model-memory"):
        assert f"(plots/{name}.png)" in summary
        assert (profiled / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    # Rewriting from the JSON alone gives the same tables.
    assert report.write_summary(profiled).read_text().split("\n", 4)[4] == summary.split("\n", 4)[4]


def test_report_only_reads_and_renders_each_record_once(tmp_path, monkeypatch):
    # A committed result folder where this machine's --report-only looks for it.
    committed = REPO / "profiles/results/cpu-xeon-2core/tensorflow"
    result_dir = shutil.copytree(committed, tmp_path / bench.device_slug() / keras.backend.backend())
    reads, renders = [], []
    read_json_object, summary_text = atomic.read_json_object, report.summary_text
    monkeypatch.setattr(atomic, "read_json_object", lambda path: reads.append(Path(path).name) or read_json_object(path))
    monkeypatch.setattr(report, "summary_text", lambda *records: renders.append(1) or summary_text(*records))
    assert main(["--report-only", "--out", str(tmp_path)]) == 0
    records = ["run.json"] + [p.name for folder in ("bench", "scaling") for p in sorted((committed / folder).glob("*.json"))]
    assert sorted(reads) == sorted(records) and len(renders) == 1
    assert (result_dir / "summary.md").read_text() == (committed / "summary.md").read_text()


def test_a_folder_holds_timings_of_one_engine_and_its_summary_says_which(monkeypatch, tmp_path, capsys):
    calls = []

    def measure_point(scope, kernel, position, patches, mode, fused, config, steps, max_seconds, jit_compile):
        calls.append(("scaling", jit_compile))
        return dict(status="ok", ms=1.0, peak_bytes=1)

    def profile_variant(variant, dataset, *args, jit_compile, **kwargs):
        calls.append(("bench", jit_compile))
        return {**dict.fromkeys(bench.BENCH_FIELDS), "variant": variant, "attention": "relu", "position": "absolute",
                "dataset": dataset, "backend": keras.backend.backend(), "xla": jit_compile,
                "status": {"train": "ok"}}

    monkeypatch.setattr(scaling, "measure_point", measure_point)
    monkeypatch.setattr(bench, "profile_variant", profile_variant)
    argv = ["relu-absolute", "--scopes", "layer", "--tokens", "16", "--trace-steps", "0", "--in-process", *NARROW]
    assert main(argv + ["--out", str(tmp_path)]) == 0
    # With XLA on both backends by default, as train.py trains.
    assert calls == [("bench", True), ("scaling", True), ("scaling", True)]
    (result_dir,) = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    assert read(result_dir / "scaling" / "layer-relu-absolute.json")["xla"] is True
    summary = (result_dir / "summary.md").read_text()
    if keras.backend.backend() != "tensorflow":
        assert "JAX compiles every pass with XLA." in summary
        calls.clear()
        assert main(argv + ["--no-jit-compile", "--out", str(tmp_path)]) == 2 and not calls
        assert capsys.readouterr().err.strip().endswith("--no-jit-compile: jax compiles every pass with XLA")
        return
    assert "TensorFlow's passes compiled with XLA, as train.py trains" in summary
    # Timings without XLA go to another folder, never beside these.
    calls.clear()
    assert main(argv + ["--no-jit-compile", "--out", str(tmp_path)]) == 2 and not calls
    assert capsys.readouterr().err.strip().endswith(
        "holds results timed with XLA (relu-absolute); give another --out, or leave out --no-jit-compile")
    assert main(argv + ["--no-jit-compile", "--out", str(tmp_path / "plain")]) == 0
    assert calls == [("bench", False), ("scaling", False), ("scaling", False)]
    (plain,) = [p for p in (tmp_path / "plain").glob("*/*") if p.is_dir()]
    assert read(plain / "scaling" / "layer-relu-absolute.json")["xla"] is False
    assert "TensorFlow's passes compiled without XLA (Keras' default on a CPU" in (plain / "summary.md").read_text()
    assert main(argv + ["--out", str(tmp_path / "plain")]) == 2
    assert capsys.readouterr().err.strip().endswith("give another --out, or add --no-jit-compile")


def test_the_summary_says_how_its_records_were_compiled_and_reads_records_from_before_the_field():
    before = {"backend": "tensorflow"}  # TensorFlow's profiles were timed without XLA until the field came
    assert report.timed_with_xla(before) is False and report.timed_with_xla({"backend": "jax"}) is True
    assert report.engine_text([before]).startswith("TensorFlow's passes compiled without XLA")
    assert report.engine_text([before, {"backend": "tensorflow", "xla": True}, {"backend": "tensorflow", "xla": True}]) == (
        "Mixed: 2 of the 3 records timed with XLA, the others without, so the tables below compare two engines.")
    assert report.engine_text([{"backend": "jax", "xla": True}]) == "JAX compiles every pass with XLA."
    assert report.engine_text([]) == ""


# === Child processes: limits are recorded, the sweep goes on ===


@pytest.mark.parametrize("limits, status", [
    (dict(memory_limit_bytes=2**20), "oom"),  # 1 MiB: the interpreter alone is over it
    (dict(time_limit_s=0.2), "timeout"),  # a backend does not even import in 0.2 s
])
def test_a_failed_point_is_recorded_and_larger_points_skipped(limits, status):
    record = scaling.run_series("layer", "softmax", "absolute", patches=(64, 128), **limits)
    first, second = record["points"]
    assert first["forward"]["status"] == status and first["forward"]["detail"]
    assert first["train"]["status"] == second["forward"]["status"] == second["train"]["status"] == "skipped"


def test_a_child_stops_after_a_large_point_and_the_rest_still_run(monkeypatch):
    peaks = {(64, "forward"): 10, (64, "train"): scaling.FRESH_CHILD_AFTER_BYTES + 1, (128, "forward"): 10,
             (128, "train"): 10}
    monkeypatch.setattr(scaling, "measure_point", lambda scope, kernel, position, patches, mode, *rest: dict(
        status="ok", ms=1.0, peak_bytes=peaks[(patches, mode)]))
    events = []
    task = dict(scope="layer", kernel="relu", position="absolute", config={}, steps=1, max_seconds=1.0,
                points=[[64, "forward"], [64, "train"], [128, "forward"], [128, "train"]])
    scaling.run_tasks(task, events.append)
    assert [(e["patches"], e["mode"]) for e in events if e["event"] == "result"] == [(64, "forward"), (64, "train")]
    # run_series starts again with what is left, so every point is measured once.
    record = scaling.run_series("layer", "relu", "absolute", patches=(64, 128), isolate=False)
    assert [p[m]["peak_bytes"] for p in record["points"] for m in ("forward", "train")] == list(peaks.values())


def test_a_point_in_a_child_process():
    record = scaling.run_series("layer", "relu", "rope", patches=(64,), modes=("forward",), steps=1)
    (point,) = record["points"]
    assert point["forward"]["status"] == "ok" and point["forward"]["ms"] > 0 and point["forward"]["flops"] > 0
    assert "train" not in point


def test_a_sweep_records_the_kerple_path_auto_took_and_the_summary_shows_it():
    kerple = scaling.run_series("layer", "relu", "kerple", patches=(16,), modes=("forward",), steps=1, isolate=False)
    softmax = scaling.run_series("layer", "softmax", "kerple", patches=(16,), modes=("forward",), steps=1,
                                 isolate=False)
    assert kerple["points"][0]["forward"]["toeplitz_path"] == "dense"  # 17 tokens: the dense path's size
    assert softmax["points"][0]["forward"]["toeplitz_path"] is None
    # A point at a grid where "auto" takes another path says so in the summary's table, by series and N.
    dft = dict(kerple, series="favor-kerple", points=[dict(kerple["points"][0], tokens=4097, forward=dict(
        kerple["points"][0]["forward"], toeplitz_path="dft"))])
    table = "\n".join(report._toeplitz_path_table([softmax, kerple, dft]))
    assert "| series | N=17 | N=4,097 |" in table
    assert "| `relu-kerple` | dense |  |" in table and "| `favor-kerple` |  | dft |" in table
    assert "softmax-kerple" not in table
    assert report._toeplitz_path_table([softmax]) == []  # and files from before the field: no table


@pytest.mark.slow
def test_the_same_command_runs_on_jax(tmp_path):
    """The backend is fixed at import, so JAX runs in its own process."""
    result = subprocess.run(
        [sys.executable, "-m", "profiles", "favor-string", "--skip-bench", "--scopes", "layer", "--tokens", "64",
         "128", "--scaling-steps", "1", "--in-process", "--out", str(tmp_path), *NARROW],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "KERAS_BACKEND": "jax"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (record_path,) = tmp_path.glob("*/jax/scaling/layer-favor-string.json")
    record = read(record_path)
    assert record["backend"] == "jax"
    flops = [p["forward"]["flops"] for p in record["points"]]
    assert all(p["forward"]["status"] == p["train"]["status"] == "ok" for p in record["points"])
    assert flops[1] / flops[0] == pytest.approx(2.0, rel=0.1)


# === Analysis ===


def power_law_series(kernel, coefficient, exponent, tokens, failed_from=None):
    """A series record whose time is coefficient * N^exponent (ms), failing ("oom") from `failed_from`."""
    points = []
    for n in tokens:
        if failed_from and n >= failed_from:
            mode = dict(status="oom" if n == failed_from else "skipped")
        else:
            mode = dict(status="ok", ms=coefficient * n**exponent, peak_bytes=n)
        points.append(dict(tokens=n, forward=mode, train=mode))
    return dict(kernel=kernel, position="absolute", fused=False, series=f"{kernel}-absolute", scope="layer",
                points=points)


TOKENS = [65, 129, 257, 513, 1025, 2049]


def test_fit_exponent_recovers_a_power_law():
    series = power_law_series("softmax", 1e-4, 2.0, TOKENS)
    fit = scaling.fit_exponent(series)
    assert fit["exponent"] == pytest.approx(2.0) and (fit["from_tokens"], fit["to_tokens"]) == (257, 2049)
    assert scaling.fit_exponent(series, quantity="peak_bytes")["exponent"] == pytest.approx(1.0)
    assert scaling.fit_exponent(power_law_series("favor", 1.0, 1.0, TOKENS[:1])) is None


def test_crossover_is_exact_for_power_laws():
    # 1e-3 N^2 = 0.5 N at N = 500: log-log interpolation of the ratio is exact.
    softmax, favor = power_law_series("softmax", 1e-3, 2.0, TOKENS), power_law_series("favor", 0.5, 1.0, TOKENS)
    result = scaling.crossover(favor, softmax)
    assert result["kind"] == "interpolated" and result["between"] == [257, 513]
    assert result["tokens"] == pytest.approx(500.0)
    assert "≈ 500 (between 257 and 513)" == report.describe_crossover(result, "favor", "softmax")


def test_crossover_below_range_none_and_softmax_failing():
    softmax = power_law_series("softmax", 1e-3, 2.0, TOKENS)
    assert scaling.crossover(power_law_series("favor", 1e-3, 1.0, TOKENS), softmax)["kind"] == "below"
    never = scaling.crossover(power_law_series("favor", 1e4, 1.0, TOKENS), softmax)
    assert never["kind"] == "none" and never["up_to"] == 2049 and never["softmax_failed"] is None
    failing = power_law_series("softmax", 1e-3, 2.0, TOKENS, failed_from=1025)
    result = scaling.crossover(power_law_series("favor", 1e4, 1.0, TOKENS), failing)
    assert (result["kind"], result["up_to"], result["softmax_failed"]) == ("none", 513, 1025)
    assert "softmax fails at 1,025" in report.describe_crossover(result, "favor", "softmax")


def test_kerple_paths_rules_on_alternating_timings():
    from profiles import kerple_paths

    def rows(fft_over_dense):
        return [{"tokens": n, "dense_train_ms": 1.0, "fft_train_ms": r} for n, r in fft_over_dense]

    # The FFT path wins at 257, loses at 513, then wins for good from 1,025.
    mixed = rows([(65, 9.0), (257, 0.9), (513, 1.1), (1025, 0.8), (2049, 0.5)])
    assert kerple_paths.crossover(mixed) == 1025 and kerple_paths.dense_max(mixed) == 513
    dense_everywhere = rows([(65, 9.0), (1025, 3.0), (4097, 1.8)])
    assert kerple_paths.crossover(dense_everywhere) is None and kerple_paths.dense_max(dense_everywhere) == 4097


    # The cost factor: "auto" takes dense where factor x model ratio >= 1. Dense won where the
    # model ratio was 0.5 and 0.2 (factor >= 2 and >= 5), FFT where it was 0.1 and 0.05
    # (factor < 10 and < 20): the interval [5, 10), its geometric middle sqrt(50).
    def timed(model, fft_over_dense):
        return {"fft_over_dense_model": model, "dense_train_ms": 1.0, "fft_train_ms": fft_over_dense}

    points = [timed(0.5, 4.0), timed(0.2, 1.5), timed(0.1, 0.8), timed(0.05, 0.5)]
    assert kerple_paths.factor_interval(points) == (5.0, 10.0, True)
    assert kerple_paths.geometric_middle(5.0, 10.0) == pytest.approx(50**0.5)
    # A point that no factor can fit (dense won at a smaller model ratio than one FFT won at).
    assert kerple_paths.factor_interval(points + [timed(0.08, 1.2)]) == (12.5, 10.0, False)
    assert kerple_paths.factor_interval(points[:2]) == (5.0, None, True)
    assert kerple_paths.geometric_middle(5.0, None) is None
    # The model ratio of a point, by hand: 8,192 patches (64 x 128, padded 128 x 256) at m = 16, d = 16,
    # the dense path's count with its 64 elementwise multiply-adds a weight.
    config = {"num_features": 16, "width": 64, "heads": 4}
    assert kerple_paths.model_ratio(8192, config) == pytest.approx(16 * 17 * 128 * 256 * 15 / (8193**2 * (32 + 64)))


def test_paths_within_the_tie_of_the_fastest_ask_nothing_of_the_fit_or_of_auto(monkeypatch):
    from performer_keras import kernel_attention
    from profiles import kerple_paths

    # The `cpu` heads at 1,025 tokens, with a DFT factor under which "auto" takes the dense path there.
    monkeypatch.setitem(kernel_attention.DFT_COST_FACTORS, "tensorflow", 10.0)

    def record(dense, dft):
        point = {"tokens": 1025, "patches": 1024, "grid": [32, 32], "dense_train_ms": dense, "dft_train_ms": dft}
        layer = {"num_features": 16, "width": 64, "heads": 4}
        return {"backend": "tensorflow", "xla": True, "shapes": {"cpu": {"layer": layer, "points": [point]}}}

    # The DFT path 2% faster: one run cannot order the two, so "auto"'s dense path is no mistake and the fit
    # gets no bound from the point.
    assert kerple_paths.TIE == 1.05
    tied = record(dense=102.0, dft=100.0)
    assert kerple_paths.auto_mistakes(tied) == [] and kerple_paths.path_constraints([tied], "tensorflow") == []
    # 10% faster: a mistake of "auto", and a bound on the DFT factor.
    apart = record(dense=110.0, dft=100.0)
    assert kerple_paths.auto_mistakes(apart) == [("cpu", 1025, "dense", "dft")]
    (constraint,) = kerple_paths.path_constraints([apart], "tensorflow")
    assert constraint[:2] == ("dft", "dense")


def test_kerple_paths_fits_both_factors_to_every_point_by_the_widest_margin(tmp_path, capsys):
    import math

    from profiles import kerple_paths

    log = math.log
    # The dense and FFT paths alone: f_fft < 10 (FFT won) and f_fft > 5 (dense won) give the geometric
    # middle of [5, 10) with a margin of sqrt(2) on either side; the DFT path, never timed, keeps 1.
    fft_only = [("fft", "dense", log(10)), ("dense", "fft", log(0.2))]
    fit = kerple_paths.fit_constraints(fft_only)
    assert fit["fft"] == pytest.approx(50**0.5) and fit["margin"] == pytest.approx(2**0.5)
    assert (fit["dft"], fit["consistent"]) == (1.0, True)
    # 1.5 < f_dft < 2 is the tightest: margin sqrt(4/3), f_dft = sqrt(3). That leaves f_fft a segment: f_fft <
    # 10 / margin, f_fft > 5 margin, and f_dft < 0.25 f_fft (the DFT path beat the FFT path at a point where it
    # counted 4 times the multiply-adds) asks f_fft > 4 sqrt(3) margin = 8: its middle, sqrt(8 x 5 sqrt(3)).
    three = fft_only + [("dft", "dense", log(2)), ("dense", "dft", log(1 / 1.5)), ("dft", "fft", log(0.25))]
    fit = kerple_paths.fit_constraints(three)
    assert fit["dft"] == pytest.approx(3**0.5) and fit["margin"] == pytest.approx((4 / 3) ** 0.5)
    assert fit["fft"] == pytest.approx((40 * 3**0.5) ** 0.5)
    # Points no factor fits (f_fft < 5 and > 10): the largest miss kept smallest, and said.
    clash = kerple_paths.fit_constraints([("fft", "dense", log(5)), ("dense", "fft", log(0.1))])
    assert clash["fft"] == pytest.approx(50**0.5) and clash["margin"] == pytest.approx(0.5**0.5)
    assert clash["consistent"] is False
    assert kerple_paths.fit_constraints([]) == {"fft": 1.0, "dft": 1.0, "margin": None, "consistent": True}

    # From records: the constraints of each point, on its backend only and timed with XLA (a record without
    # it constrains nothing); --fit-only prints each backend's fit.
    def record(backend, tokens, xla=True, **train_ms):
        layer = {"num_features": 16, "width": 64, "heads": 4}
        point = {"patches": tokens - 1, "tokens": tokens, "grid": list(scaling.grid_for(tokens - 1)),
                 **{f"{path}_train_ms": ms for path, ms in train_ms.items()}}
        return {"backend": backend, "xla": xla, "shapes": {"cpu": {"layer": layer, "points": [point]}}}

    records = [record("jax", 4097, dense=3.0, fft=2.0, dft=1.0), record("tensorflow", 1025, dense=1.0, fft=9.0),
               record("tensorflow", 4097, xla=False, dense=3.0, dft=1.0)]
    assert kerple_paths.fitted(records, "tensorflow") == [records[1]]
    costs = kerple_paths.toeplitz_costs(4097, (64, 64), 16, 16)
    assert sorted(kerple_paths.path_constraints(records, "jax")) == sorted(
        [("dft", "dense", log(costs["dense"] / costs["dft"])), ("dft", "fft", log(costs["fft"] / costs["dft"]))])
    for index, value in enumerate(records):
        folder = tmp_path / str(index)
        folder.mkdir()
        (folder / "kerple_paths.json").write_text(json.dumps(value))
    assert kerple_paths.main(["--fit-only", "--out", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"jax", "tensorflow"}
    assert printed["jax"] == pytest.approx(kerple_paths.joint_factors(records, "jax"))
    assert printed["tensorflow"]["dft"] == 1.0 and printed["tensorflow"]["consistent"] is True


def test_kerple_paths_remodel_recomputes_the_model_fields_and_keeps_the_timings(monkeypatch, tmp_path, capsys):
    from performer_keras import kernel_attention
    from profiles import kerple_paths

    source = REPO / "profiles/results/epyc-f23m1/cpu-epyc-2core/tensorflow/kerple_paths.json"
    target = tmp_path / "machine" / "kerple_paths.json"
    target.parent.mkdir()
    target.write_text(source.read_text())
    # A committed file follows today's model already: byte for byte the same.
    assert kerple_paths.main(["--remodel", "--out", str(tmp_path)]) == 0
    assert target.read_text() == source.read_text()
    assert capsys.readouterr().out.split() == [str(target)]
    # Without the DFT path's elementwise term: its ratios are its matmuls' alone, worked by hand.
    monkeypatch.setattr(kernel_attention, "DFT_ELEMENTWISE_COST", 0)
    assert kerple_paths.main(["--remodel", "--out", str(tmp_path)]) == 0
    before, after = json.loads(source.read_text()), json.loads(target.read_text())
    assert list(after) == list(before)  # no field added or dropped
    rows = 0
    for name, shape in after["shapes"].items():
        layer = shape["layer"]
        m, d = layer["num_features"], layer["width"] // layer["heads"]
        for row, old in zip(shape["points"], before["shapes"][name]["points"], strict=True):
            assert {key: value for key, value in row.items() if key != "dft_over_dense_model"} == {
                key: value for key, value in old.items() if key != "dft_over_dense_model"}
            height, width = row["grid"]
            dense = row["tokens"] ** 2 * (m + d + kernel_attention.DENSE_ELEMENTWISE_COST)
            matmuls = m * (d + 1) * 4 * height * width * (height + width)
            assert row["dft_over_dense_model"] == pytest.approx(matmuls / dense)
            rows += 1
    assert rows == 6
    assert after["factor_interval"] == before["factor_interval"]
    assert after["dft_factor_interval"] != before["dft_factor_interval"]
    assert after["dft_factor_interval"] == list(kerple_paths.factor_interval(
        [row for shape in after["shapes"].values() for row in shape["points"]], "dft")[:2])


def test_kerple_paths_records_a_grid_out_of_memory_and_stops_the_shape(monkeypatch):
    from profiles import kerple_paths

    class XlaRuntimeError(RuntimeError):  # as JAX raises it: only the message says what failed
        pass

    def time_path(patches, path, kernel, config, jit_compile):
        if patches == 64 and path == "fft":
            raise XlaRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 34936856704 bytes.\nmore")
        return {"forward": (1.0, False), "train": (2.0 if path == "dense" else 4.0, False)}

    monkeypatch.setattr(kerple_paths, "time_path", time_path)
    monkeypatch.setattr(kerple_paths.keras.backend, "clear_session", lambda: None)
    config = {"num_features": 16, "width": 64, "heads": 4}
    lines = []
    rows = kerple_paths.measure(config, patches=(16, 64, 256), rounds=2, log=lines.append)
    assert [row["tokens"] for row in rows] == [17, 65]  # 256 patches never measured
    assert rows[1]["out_of_memory"] == {"path": "fft", "error": "RESOURCE_EXHAUSTED: Out of memory allocating 34936856704 bytes."}
    assert "dense_train_ms" not in rows[1] and "fft out of memory" in lines[-1]
    # The rules read only the grids where both paths ran.
    assert kerple_paths.dense_max(rows) == 17 and kerple_paths.crossover(rows) is None
    assert kerple_paths.factor_interval(rows)[0] == pytest.approx(1 / rows[0]["fft_over_dense_model"])
    # Any other failure is a bug, not a measurement: it is raised.
    monkeypatch.setattr(kerple_paths, "time_path", lambda *args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        kerple_paths.measure(config, patches=(16,), rounds=1)


def test_kerple_paths_times_the_three_paths_and_softmax_alternately_on_the_shapes_and_grids_asked(monkeypatch, tmp_path, capsys):
    from profiles import kerple_paths

    calls = []

    def time_path(patches, path, kernel, config, jit_compile):
        calls.append((patches, kernel, path, jit_compile))
        # At the larger grid softmax's training step is timed by its compiling first call (`time_calls`' cold).
        return {"forward": (1.0, False),
                "train": ({"dense": 2.0, "fft": 3.0, "dft": 1.5}.get(path, 2.5), patches == 64 and kernel == "softmax")}

    monkeypatch.setattr(kerple_paths, "time_path", time_path)
    monkeypatch.setattr(kerple_paths.keras.backend, "clear_session", lambda: None)
    argv = ["--shapes", "cpu", "--tokens", "16", "64", "--rounds", "2", "--out", str(tmp_path)]
    assert kerple_paths.main(argv) == 0
    one_round = [("favor", "dense"), ("favor", "fft"), ("favor", "dft"), ("softmax", "auto")]
    # With XLA on both backends by default, as train.py trains.
    assert calls == [(patches, *subject, True) for patches in (16, 64) for _ in range(2) for subject in one_round]
    record = json.loads(next(tmp_path.rglob("kerple_paths.json")).read_text())
    assert list(record["shapes"]) == ["cpu"] and record["rounds"] == 2 and record["xla"] is True
    assert record["command"].endswith("python -m profiles.kerple_paths " + " ".join(argv))
    point = record["shapes"]["cpu"]["points"][0]
    assert [p["tokens"] for p in record["shapes"]["cpu"]["points"]] == [17, 65]
    assert (point["dense_train_ms"], point["fft_train_ms"], point["dft_train_ms"], point["softmax_train_ms"]) == (2.0, 3.0, 1.5, 2.5)
    # Which times a compiling first call made, in the row and marked in the log.
    assert [p["cold"] for p in record["shapes"]["cpu"]["points"]] == [[], ["softmax_train"]]
    log = capsys.readouterr().out.splitlines()
    assert log[0].endswith("softmax 2.50 ms") and log[1].endswith("softmax 2.50 ms*")
    # An unknown shape or subject is a usage error, in one line, before anything is timed.
    calls.clear()
    assert kerple_paths.main(["--shapes", "huge"]) == 2 and not calls
    assert capsys.readouterr().err.strip().endswith("Unknown shape 'huge'; expected one of ('cpu', 'reference')")
    assert kerple_paths.main(["--subjects", "fft", "flash"]) == 2 and not calls
    assert "Unknown subject 'flash'" in capsys.readouterr().err
    # Without XLA: TensorFlow's passes as Keras compiles them on a CPU by default; JAX has no such passes.
    if keras.backend.backend() == "tensorflow":
        assert kerple_paths.main(argv[:-2] + ["--no-jit-compile", "--out", str(tmp_path / "plain")]) == 0
        assert {call[-1] for call in calls} == {False}
        assert json.loads(next((tmp_path / "plain").rglob("kerple_paths.json")).read_text())["xla"] is False
    else:
        assert kerple_paths.main(["--no-jit-compile"]) == 2 and not calls
        assert capsys.readouterr().err.strip().endswith("--no-jit-compile: jax compiles every pass with XLA")


def test_kerple_paths_times_only_the_subjects_asked_and_fits_nothing_without_the_dense_path(monkeypatch, tmp_path):
    from profiles import kerple_paths

    calls = []

    def time_path(patches, path, kernel, config, jit_compile):
        calls.append((patches, path))
        return {"forward": (1.0, False), "train": ({"fft": 3.0, "dft": 1.5}[path], False)}

    monkeypatch.setattr(kerple_paths, "time_path", time_path)
    monkeypatch.setattr(kerple_paths.keras.backend, "clear_session", lambda: None)
    # The two largest grids, where softmax-kerple and the dense path take minutes on a slow CPU.
    argv = ["--shapes", "cpu", "--subjects", "fft", "dft", "--tokens", "8192", "16384", "--rounds", "1",
            "--out", str(tmp_path)]
    assert kerple_paths.main(argv) == 0
    assert calls == [(8192, "fft"), (8192, "dft"), (16384, "fft"), (16384, "dft")]
    record = json.loads(next(tmp_path.rglob("kerple_paths.json")).read_text())
    assert record["subjects"] == ["fft", "dft"]
    points = record["shapes"]["cpu"]["points"]
    assert [(p["fft_train_ms"], p["dft_train_ms"]) for p in points] == [(3.0, 1.5), (3.0, 1.5)]
    assert not any(key.startswith("dense") or "over_dense" in key for p in points for key in p)
    assert record["factor_interval"] == record["dft_factor_interval"] == [None, None]
    assert record["shapes"]["cpu"]["crossover_tokens"] is record["shapes"]["cpu"]["dense_max_tokens"] is None
    # "auto" is still checked among the two paths timed (the DFT path was the faster at both grids): an FFT
    # factor of 1 takes the FFT path at both, two mistakes; one of 1,000 takes the DFT path, none.
    from performer_keras import kernel_attention

    monkeypatch.setitem(kernel_attention.FFT_COST_FACTORS, record["backend"], 1.0)
    assert kerple_paths.auto_mistakes(record) == [("cpu", 8193, "fft", "dft"), ("cpu", 16385, "fft", "dft")]
    monkeypatch.setitem(kernel_attention.FFT_COST_FACTORS, record["backend"], 1000.0)
    assert kerple_paths.auto_mistakes(record) == []


# === Small helpers ===


def test_grid_for_is_the_squarest_grid():
    assert [scaling.grid_for(n) for n in (64, 128, 16384, 12)] == [(8, 8), (8, 16), (128, 128), (3, 4)]


def test_device_slug():
    assert bench.device_slug("cpu: Intel(R) Xeon(R) Processor (2 cores)") == "cpu-xeon-2core"
    assert bench.device_slug("gpu: NVIDIA H100 80GB HBM3") == "gpu-h100-80gb-hbm3"


def test_operation_names_fold_over_blocks():
    fold = traces._fold_op_name
    assert fold("gradient_tape/vit_favor_rope_1/block_3_attention_1/rope_3/MatMul_2") == "attention/rope/MatMul (backward)"
    assert fold("vit_favor_rope_1/block_0_mlp_hidden_1/MatMul") == "mlp_hidden/MatMul"


def test_analytic_model_flops_adds_up():
    # One block of 50 tokens at width 8, MLP 16, 2 heads, softmax, 7x7 patches of 4x4x1, 10 classes.
    config = dict(patch_size=4, width=8, depth=1, heads=2, mlp_dim=16)
    expected = 2 * 49 * 16 * 8 + (8 * 50 * 64 + 4 * 50 * 50 * 8) + 4 * 50 * 8 * 16 + 2 * 8 * 10
    assert analytic_model_flops((28, 28, 1), 10, "softmax", **config) == expected == 143_904


def test_favor_kerple_error_falls_as_1_over_sqrt_m_at_the_default_qk_norm_only():
    from profiles.favor_estimator import slope_interval
    from performer_keras.registry import DEFAULT_QK_NORM

    # The slope of log error against log m (64 to 1,024, d = 32), 95% interval over 6 draws.
    # At the default, "at least as fast as 1/sqrt(m)" must not be rejected (the interval
    # reaches -0.5 or below) and the interval must be narrow enough to reject a slow fall.
    default = slope_interval(DEFAULT_QK_NORM, features=(64, 256, 1024), trials=6)
    low, high = default["ci95"]
    assert low <= -0.5 and high < -0.35, default
    # At Luo et al.'s norm the estimator is in its high-variance range: the same test fails.
    luo = slope_interval(1.0, features=(64, 256, 1024), trials=6)
    assert luo["ci95"][0] > -0.5, luo


# === The engine benchmark ===


@pytest.mark.slow
def test_engine_child_measures_every_subject_with_a_stock_vit_of_equal_size():
    from profiles import engine

    task = dict(engine.TASK, size="tiny", limit=512, rounds=1, subjects=engine.SUBJECTS + engine.ROOFLINE_SUBJECTS,
                num_features=8, precision="mixed_bfloat16")
    events = engine.run_child(task, "tensorflow", log=lambda line: None)
    setup = next(e for e in events if e["event"] == "setup")
    # The stock ViT swaps attention only: MultiHeadAttention has the same projections as softmax KernelAttention.
    assert setup["params"]["stock"] == setup["params"]["fit:softmax-absolute"]
    assert set(setup["dtype_policies"].values()) == {"mixed_bfloat16"}
    median, samples = engine.medians(events)
    assert set(median) == set(engine.SUBJECTS) and all(len(v) == 1 and v[0] > 0 for v in samples.values())
    assert set(engine.ratios(median)) == set(engine.TARGETS) - {"train_path_over_baseline", "workers_over_one"}
    roofline = engine.roofline(events, median, task)
    assert set(roofline["ceiling_gflops_per_second"]) == set(engine.ROOFLINE_SUBJECTS)
    # Per image, a training step of the tiny ViT (16 tokens, width 16) costs at least 3x its forward matmuls.
    from experiments.flops import analytic_model_flops
    from performer_keras.registry import SIZES

    forward = analytic_model_flops((28, 28, 1), 10, "softmax", **SIZES["tiny"])
    per_image = roofline["train_flops_per_image"]
    assert set(per_image) == {"fit:softmax-absolute", "fit:favor-absolute", "fit:relu-absolute", "train_path"}
    assert 3 * forward <= per_image["fit:softmax-absolute"] == per_image["train_path"] < 6 * forward
    assert all(0 < share < float("inf") for shares in roofline["share_of_ceiling"].values() for share in shares.values())


def test_engine_records_are_named_by_the_settings_that_differ_from_the_default():
    from profiles import engine

    task = engine.TASK
    assert engine.record_name(task, engine.BACKENDS) == "engine.json"
    assert engine.record_name(dict(task, num_features=16), ["tensorflow", "jax"]) == "engine-m16.json"
    assert engine.record_name(dict(task, rounds=9), ["tensorflow"]) == "engine-r9-tensorflow.json"
    assert engine.record_name(dict(task, num_features=16, rounds=5), ["jax", "tensorflow"]) == "engine-m16-r5-jax-tensorflow.json"
    assert engine.record_name(dict(task, precision="float32", limit=512), engine.BACKENDS) == "engine-limit512.json"
    gpu = dict(task, rounds=2, dataset="cifar10", size="reference", limit=None, precision="mixed_bfloat16")
    assert engine.record_name(task, ["jax"], compare_huge_pages=True) == "engine-jax-huge-pages.json"
    assert engine.record_name(dict(task, roofline=True), ["tensorflow"]) == "engine-tensorflow-roofline.json"
    assert (engine.record_name(gpu, ["jax"], [2, 4, 8])
            == "engine-r2-cifar10-reference-limit-all-mixed_bfloat16-jax-w2-4-8.json")


def test_engine_compares_huge_pages_in_alternating_children_and_runs_a_baseline_without_them(monkeypatch, tmp_path):
    from experiments import huge_pages
    from profiles import engine

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
    monkeypatch.delenv("PERFORMER_HUGE_PAGES", raising=False)
    children = []

    def fake_child(task, backend, code=engine.REPO, log=print, env=None):
        # train_path 150 images/s with huge pages, 100 without; the other subjects unchanged.
        on = env is None or env["PERFORMER_HUGE_PAGES"] != "0"
        children.append((Path(code).name, env, on))
        return [{"event": "setup", "params": {}, "dtype_policies": {}, "train_images": 10},
                *({"event": "sample", "subject": subject, "warmup": False,
                   "images_per_second": 150.0 if on and subject == "train_path" else 100.0}
                  for subject in task["subjects"])]

    monkeypatch.setattr(engine, "run_child", fake_child)
    baseline = tmp_path / "old-checkout"
    (baseline / "experiments").mkdir(parents=True)
    (baseline / "experiments" / "__init__.py").touch()
    assert engine.main(["--backends", "jax", "--compare-huge-pages", "--baseline", str(baseline),
                        "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*/engine-jax-huge-pages.json")
    record = read(path)
    assert record["huge_pages"] is True and record["cpu"] == latency.cpu_identity()
    comparison = record["huge_pages_comparison"]["jax"]
    assert comparison["on_over_off"] == dict.fromkeys(engine.SUBJECTS[:-1], 1.0) | {"train_path": 1.5}
    assert all(len(values) == engine.BASELINE_ROUNDS for arm in ("on", "off")
               for values in comparison["samples"][arm].values())
    on = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "PERFORMER_HUGE_PAGES": None}
    off = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "PERFORMER_HUGE_PAGES": "0"}
    # The first child is the main measurement, as the command runs; then the baseline's, then the comparison's.
    assert children[0] == (engine.REPO.name, None, True)
    assert [c[:2] for c in children[1:1 + 2 * engine.BASELINE_ROUNDS]] == [(engine.REPO.name, None),
                                                                         ("old-checkout", off)] * engine.BASELINE_ROUNDS
    assert [c[1] for c in children[1 + 2 * engine.BASELINE_ROUNDS:]] == [on, off] * engine.BASELINE_ROUNDS
    assert record["baseline"]["train_path_over_baseline"] == 1.5
    assert huge_pages.has_tunable(os.environ)  # the measuring process's own environment untouched


def test_engine_roofline_reads_each_subject_s_flops_per_second_against_the_matmul_rates(monkeypatch, tmp_path):
    from profiles import engine

    def fake_child(task, backend, code=engine.REPO, log=print, env=None):
        # 2,000 images/s of softmax at 25 MFLOP an image is 50 GFLOP/s; the matmuls run at 400 and 100 GFLOP/s.
        rates = {"matmul:square": 400.0, "matmul:vit": 100.0}
        flops = {f"fit:{variant}": 25e6 for variant in engine.VARIANTS}
        return [{"event": "flops", "train_flops_per_image": flops},
                {"event": "setup", "params": {}, "dtype_policies": {}, "train_images": 10},
                *({"event": "sample", "subject": subject, "warmup": warmup,
                   **({"gflops_per_second": rates[subject] * (1 + warmup)} if subject in rates
                      else {"images_per_second": 2000.0 * (1 + warmup)})}
                  for warmup in (True, False) for subject in task["subjects"])]

    monkeypatch.setattr(engine, "run_child", fake_child)
    assert engine.main(["--backends", "jax", "--roofline", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*/engine-jax-roofline.json")
    entry = read(path)["backends"]["jax"]
    assert set(entry["images_per_second"]) == set(engine.SUBJECTS)  # the matmul rates are not images
    roofline = entry["roofline"]
    assert roofline["ceiling_gflops_per_second"] == {"matmul:square": 400.0, "matmul:vit": 100.0}
    assert roofline["train_gflops_per_second"]["train_path"] == pytest.approx(50.0)
    assert roofline["share_of_ceiling"]["matmul:square"]["fit:favor-absolute"] == pytest.approx(0.125)
    assert roofline["share_of_ceiling"]["matmul:vit"]["train_path"] == pytest.approx(0.5)
    assert "stock" not in roofline["train_gflops_per_second"]  # its Einsums escape TensorFlow's FLOP count


def test_matmul_rate_times_the_vit_s_own_matmuls_and_refuses_an_empty_call():
    from experiments.flops import analytic_attention_flops
    from profiles import matmul_rate

    # One block's forward matmuls at batch 3 are the analytic count's: softmax attention plus the MLP.
    batch, tokens, width, heads, mlp = 3, 17, 32, 4, 64
    expected = batch * (analytic_attention_flops(tokens, width, heads, "softmax") + 4 * tokens * width * mlp)
    assert matmul_rate.matmul_flops(matmul_rate.vit_shapes(batch, tokens, width, heads, mlp)) == expected
    assert matmul_rate.matmul_flops(matmul_rate.square_shapes(8)) == 2 * 8**3
    for dtype in ("float32", "bfloat16"):
        assert 0 < matmul_rate.matmul_gflops(matmul_rate.vit_shapes(2, 5, 8, 2, 16), copies=2, calls=2, dtype=dtype) < 1e6
    with pytest.raises(ValueError, match="copies"):
        matmul_rate.matmul_gflops(matmul_rate.square_shapes(8), copies=0)


def test_matmul_rate_records_each_shape_s_rounds_with_the_cpu_it_ran_on(monkeypatch, tmp_path, capsys):
    from experiments.flops import analytic_attention_flops
    from profiles import matmul_rate

    shapes = matmul_rate.machine_shapes()
    assert list(shapes) == ["square 2048", "small ViT block, MNIST, batch 128", "reference ViT block, MNIST, batch 128"]
    # The reference ViT on MNIST: 7 x 7 patches and CLS, width 256, 8 heads, MLP 512.
    reference, copies = shapes["reference ViT block, MNIST, batch 128"]
    assert copies == matmul_rate.COPIES and matmul_rate.matmul_flops(reference) == 128 * (
        analytic_attention_flops(50, 256, 8, "softmax") + 4 * 50 * 256 * 512)
    tiny = {"square 8": (matmul_rate.square_shapes(8), 2), "block": (matmul_rate.vit_shapes(2, 5, 8, 2, 16), 3)}
    monkeypatch.setattr(matmul_rate, "machine_shapes", lambda: tiny)
    assert matmul_rate.main(["--out", str(tmp_path), "--rounds", "2"]) == 0
    path = tmp_path / bench.device_slug() / keras.backend.backend() / "matmul_rate.json"
    record = read(path)
    assert record["cpu"] == latency.cpu_identity() and record["rounds"] == 2
    assert record["command"].endswith(f"python -m profiles.matmul_rate --out {tmp_path} --rounds 2")
    assert [row["shapes"] for row in record["rows"]] == ["square 8", "block"]
    for row, (name, (shape, copies)) in zip(record["rows"], tiny.items()):
        assert len(row["samples"]) == 2 and row["gflops_per_second"] == statistics.median(row["samples"]) > 0
        assert row["gflop_per_call"] == pytest.approx(copies * matmul_rate.matmul_flops(shape) / 1e9)
    assert f"written: {path}" in capsys.readouterr().out


def test_engine_barrier_holds_each_child_until_all_have_arrived(tmp_path):
    from profiles.engine_child import wait_at_barrier

    passed = []
    first = threading.Thread(target=lambda: passed.append(wait_at_barrier(tmp_path, 0, 2, round_index=1)))
    first.start()
    first.join(0.5)
    assert first.is_alive() and not passed  # alone at the barrier, it waits
    wait_at_barrier(tmp_path, 1, 2, round_index=1)
    first.join(5)
    assert passed == [None]
    # The next round is a new barrier; a missing sibling is an error, not a hang.
    with pytest.raises(RuntimeError, match="never reached round 2"):
        wait_at_barrier(tmp_path, 0, 2, round_index=2, timeout_s=0.2)


def test_engine_workers_share_the_memory_meet_at_a_barrier_and_add_up(monkeypatch):
    from experiments import benchmark
    from profiles import engine

    calls = []

    def fake_child(task, backend, code=engine.REPO, log=print, env=None):
        calls.append((task["subjects"], task["barrier"]["index"], task["barrier"]["count"], env))
        speed = 100.0 * (task["barrier"]["index"] + 1)
        return [{"event": "sample", "subject": "train_path", "warmup": True, "images_per_second": 1.0},
                *({"event": "sample", "subject": "train_path", "warmup": False, "images_per_second": speed + extra}
                  for extra in (0.0, 10.0, 50.0))]

    monkeypatch.setattr(engine, "run_child", fake_child)
    result = engine.concurrent_train_path(dict(engine.TASK), "jax", 3, log=lambda line: None)
    assert sorted(call[1] for call in calls) == [0, 1, 2]
    assert all(call[0] == ["train_path"] and call[2] == 3 for call in calls)
    assert all(call[3] == benchmark.worker_memory(3) and call[3]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.300"
               for call in calls)
    # Medians of the timed rounds (warm-ups dropped), summed.
    assert result["per_worker_images_per_second"] == [110.0, 210.0, 310.0]
    assert result["images_per_second"] == 630.0 and result["workers"] == 3


def test_engine_record_keeps_every_finished_stage_when_a_later_one_fails(monkeypatch, tmp_path):
    from profiles import engine

    def fake_child(task, backend, code=engine.REPO, log=print, env=None):
        return [{"event": "setup", "params": {}, "dtype_policies": {}, "train_images": 10},
                *({"event": "sample", "subject": subject, "warmup": False, "images_per_second": 100.0}
                  for subject in task["subjects"])]

    slot_ends_at = [4]

    def fake_workers(task, backend, workers, log=print, mps=None):
        if workers in slot_ends_at:
            raise RuntimeError("the slot ended")
        return {"workers": workers, "per_worker_images_per_second": [150.0] * workers, "images_per_second": 150.0 * workers}

    monkeypatch.setattr(engine, "run_child", fake_child)
    monkeypatch.setattr(engine, "concurrent_train_path", fake_workers)
    argv = ["--backends", "jax", "--worker-counts", "2", "4", "--out", str(tmp_path)]
    with pytest.raises(RuntimeError, match="the slot ended"):
        engine.main(argv)
    (path,) = tmp_path.glob("*/engine-jax-w2-4.json")
    record = read(path)
    assert record["complete"] is False and [e["workers"] for e in record["backends"]["jax"]["concurrent"]] == [2]
    assert record["backends"]["jax"]["ratios"]["workers_over_one"] == {"2": 3.0}
    slot_ends_at.clear()
    assert engine.main(argv) == 0
    assert read(path)["complete"] is True and len(read(path)["backends"]["jax"]["concurrent"]) == 2


def test_engine_under_an_mps_daemon_times_each_worker_count_without_and_with_it(monkeypatch, tmp_path):
    from profiles import engine
    from profiles.child import EVENT_PREFIX

    monkeypatch.setenv(engine.MPS_PIPE, str(tmp_path / "mps-pipe"))
    children = []

    def fake_process(command, cwd, env, capture_output, text):
        # One engine child: train_path at 100 images/s alone or without MPS, 150 each under it.
        task = json.loads(command[2])
        under_mps = engine.MPS_PIPE in env
        children.append((task["subjects"], under_mps))
        events = [{"event": "start", "experiments_from": str(engine.REPO)},
                  {"event": "setup", "params": {}, "dtype_policies": {}, "train_images": 10},
                  *({"event": "sample", "subject": subject, "warmup": False,
                     "images_per_second": 150.0 if under_mps else 100.0} for subject in task["subjects"]),
                  {"event": "done"}]
        stdout = "".join(EVENT_PREFIX + json.dumps(event) + "\n" for event in events)
        return subprocess.CompletedProcess(command, 0, stdout=stdout, stderr="")

    monkeypatch.setattr(engine.subprocess, "run", fake_process)
    assert engine.main(["--backends", "jax", "--worker-counts", "2", "--out", str(tmp_path)]) == 0
    # The one-run reference without MPS, then 2 workers without it, then 2 under it.
    assert children == [(engine.SUBJECTS, False), *[(["train_path"], False)] * 2, *[(["train_path"], True)] * 2]
    (path,) = tmp_path.glob("*/engine-jax-w2-mps.json")
    record = read(path)
    assert record["task"]["mps"] is True
    assert [(entry["mps"], entry["images_per_second"]) for entry in record["backends"]["jax"]["concurrent"]] == [
        (False, 200.0), (True, 300.0)]
    assert record["backends"]["jax"]["ratios"]["workers_over_one"] == {"2": 2.0, "2+mps": 3.0}


@pytest.mark.slow
def test_engine_workers_train_at_once_on_jax():
    from profiles import engine

    task = dict(engine.TASK, size="tiny", limit=512, rounds=1, num_features=8)
    result = engine.concurrent_train_path(task, "jax", 2, log=lambda line: None)
    assert len(result["per_worker_images_per_second"]) == 2 and min(result["per_worker_images_per_second"]) > 0


def test_engine_baseline_alternates_processes_and_takes_medians(monkeypatch, tmp_path):
    from experiments import huge_pages
    from profiles import engine

    calls = []

    def fake_child(task, backend, code, log, env=None):
        calls.append((Path(code).name, task["num_features"], task["subjects"], env))
        speed = 300.0 if Path(code) == engine.REPO else 100.0 + len(calls)
        return [{"event": "sample", "subject": "train_path", "warmup": False, "images_per_second": speed}]

    monkeypatch.setattr(engine, "run_child", fake_child)
    old = tmp_path / "old"
    old.mkdir()
    result = engine.baseline_comparison(old, "tensorflow", dict(engine.TASK, num_features=16), log=lambda line: None)
    # Both checkouts measure the same task, m included; a checkout older than experiments/huge_pages.py
    # runs without huge pages, as its commands did, and this one as it was started.
    without = engine.huge_pages_variables(huge_pages.without_tunable)
    assert without["PERFORMER_HUGE_PAGES"] == "0"
    assert calls == [(engine.REPO.name, 16, ["train_path"], None), ("old", 16, ["train_path"], without)] * engine.BASELINE_ROUNDS
    assert result["baseline_images_per_second"] == statistics.median([102.0, 104.0])
    assert result["train_path_over_baseline"] == pytest.approx(300.0 / 103.0)
    (old / "experiments").mkdir()
    (old / "experiments" / "huge_pages.py").touch()
    calls.clear()
    engine.baseline_comparison(old, "tensorflow", dict(engine.TASK, num_features=16), log=lambda line: None)
    assert [call[3] for call in calls] == [None, None] * engine.BASELINE_ROUNDS


# === bfloat16 against float32 ===


@pytest.mark.slow
def test_precision_check_trains_each_variant_in_both_precisions_and_seeds(tmp_path):
    from profiles import precision

    # 300 test images, not the tool's 10,000, and no XLA (this test took 78 s with it and 45 s without, alone
    # on a 2-core CPU): what is tested is the pairing of the runs, not XLA's arithmetic.
    settings = dict(precision.SETTINGS, size="tiny", limit=300, limit_test=True, epochs=1, batch_size=32,
                    jit_compile=False)
    # One variant, the one with the most float32 islands (FAVOR+ normaliser, FFT); each layer's own test
    # already runs every mixed precision policy.
    rows = precision.compare(["favor-kerple"], settings=settings, seeds=(0, 3), log=lambda line: None)
    assert list(rows) == ["favor-kerple"]
    favor = rows["favor-kerple"]
    assert list(favor["runs"]) == ["0", "3"]
    for runs in favor["runs"].values():
        for name in precision.PRECISIONS:
            assert 0.0 <= runs[name]["test_accuracy"] <= 1.0 and len(runs[name]["loss"]) == 1
        # The two runs of a seed differ in precision only: bfloat16 rounding moves the loss, a little.
        assert runs["float32"]["loss"] != runs["mixed_bfloat16"]["loss"]
        assert runs["mixed_bfloat16"]["loss"][0] == pytest.approx(runs["float32"]["loss"][0], rel=0.05)
    assert favor["differences"] == [pytest.approx(runs["mixed_bfloat16"]["test_accuracy"] - runs["float32"]["test_accuracy"])
                                    for runs in favor["runs"].values()]
    assert favor["difference"] == pytest.approx(sum(favor["differences"]) / 2)
    assert favor["paired"]["n"] == 2 and favor["paired"]["mean"] == pytest.approx(favor["difference"])
    assert favor["holds"] == (favor["difference"] >= -precision.TOLERANCE)
    # Each seed starts from its own weights.
    assert favor["runs"]["0"]["float32"]["loss"] != favor["runs"]["3"]["float32"]["loss"]


def test_precision_record_names_its_seeds_unless_the_default():
    from profiles import precision

    assert precision.record_name([0]) == "precision.json"
    assert precision.record_name([0, 1, 2]) == "precision-seeds0-1-2.json"
    assert precision.record_name([4]) == "precision-seeds4.json"


def test_precision_record_is_written_after_each_variant_and_resumed(tmp_path, monkeypatch):
    from profiles import precision

    calls = []

    def compare(variants, seeds, **kwargs):
        calls.append(list(variants))
        if variants == ["relu-rope"] and len(calls) == 2:
            raise RuntimeError("killed")  # the process dies during the second variant
        return {name: {"difference": -0.001, "holds": True} for name in variants}

    monkeypatch.setattr(precision, "compare", compare)
    argv = ["relu-absolute", "relu-rope", "--out", str(tmp_path), "--seeds", "1", "0"]
    with pytest.raises(RuntimeError):
        precision.main(argv)
    [path] = tmp_path.rglob("precision-seeds0-1.json")
    record = read(path)
    assert record["complete"] is False and list(record["variants"]) == ["relu-absolute"]
    assert record["settings"]["seed"] == [0, 1]
    # The same command goes on from the finished variant.
    assert precision.main(argv) == 0
    assert calls == [["relu-absolute"], ["relu-rope"], ["relu-rope"]]
    record = read(path)
    assert record["complete"] is True and list(record["variants"]) == ["relu-absolute", "relu-rope"]
    # Other settings start afresh.
    assert precision.earlier_rows(path, dict(precision.SETTINGS, seed=[0, 1, 2])) == {}
    assert precision.earlier_rows(tmp_path / "absent.json", dict(precision.SETTINGS, seed=[0, 1])) == {}


def test_run_manifest_keeps_one_entry_per_command(tmp_path):
    entry = lambda command, started: dict(command=command, started=started, settings={})
    report.append_run(tmp_path, entry("python -m profiles a", "1"))
    report.append_run(tmp_path, entry("python -m profiles b", "2"))
    report.append_run(tmp_path, entry("python -m profiles a", "3"))  # a re-run overwrote a's files
    report.append_run(tmp_path, dict(entry("python -m profiles a", "3"), finished="4"))  # the same run, finished
    runs = read(tmp_path / "run.json")["runs"]
    assert [(r["command"][-1], r["started"], r.get("finished")) for r in runs] == [("b", "2", None), ("a", "3", "4")]


def test_a_relative_out_is_made_absolute_for_the_children_that_run_in_the_repository(tmp_path, monkeypatch):
    # Each measurement's child process runs in the repository's root (profiles/child.py): with a relative
    # --out its traces would land there, apart from the rest of the results.
    from profiles.__main__ import parse_args

    monkeypatch.chdir(tmp_path)
    assert parse_args(["--out", "mine", "--skip-bench"]).out == tmp_path.resolve() / "mine"
