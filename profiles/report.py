"""The JSON results of one device and backend as a Markdown summary with plots.

    <result_dir>/run.json             the commands that produced the results
    <result_dir>/bench/*.json         one record per variant and dataset (`bench.profile_variant`)
    <result_dir>/scaling/*.json       one record per scope and series (`scaling.run_series`)
    <result_dir>/plots/*.png          written here: time and memory against N, log-log
    <result_dir>/summary.md           written here

`write_summary(result_dir)` reads whatever is there, so a partial run still
gets a summary. Plotting uses matplotlib without a display.
"""

import datetime
import math
from pathlib import Path

from experiments import atomic
from experiments.figures import kernel_colour, new_figure
from experiments.markdown import table_lines
from performer_keras.registry import KERNELS, POSITIONS, linear_kernels
from profiles import SCOPES
from profiles.scaling import CHEAP_SECONDS, FIT_POINTS, MAX_CALLS, MODES, crossover, fit_exponent, ok_points

MODE_TITLE = {"forward": "forward", "train": "forward + backward"}
PLOTS = "plots"  # the figures' folder in a result_dir
# A scaling point's quantities: (plot file's name, axis label, scale).
QUANTITIES = {"ms": ("time", "time per call (ms)", 1.0), "peak_bytes": ("memory", "peak memory (MiB)", 2**-20)}


# === Reading ===


def load_results(result_dir):
    """(manifest, bench records, scaling records, summary.md's text) of `result_dir`; ValueError in one line naming
    a file that is no JSON object, or the folder whose records lack what the summary needs (every write here is
    atomic, but a hand edit or a damaged disk is not): the text is rendered here, so that is found out before
    anything is measured or written."""
    result_dir = Path(result_dir)
    read = lambda folder: [atomic.read_json_object(p) for p in sorted((result_dir / folder).glob("*.json"))]
    manifest, bench, scaling = read_manifest(result_dir / "run.json"), read("bench"), read("scaling")
    try:
        text = summary_text(manifest, bench, scaling)
    except atomic.MALFORMED as error:
        raise ValueError(f"the records in {result_dir} do not make a summary ({error!r}): one was edited by hand or "
                         "written by other code") from None
    return manifest, bench, scaling, text


def read_manifest(path):
    """The run.json at `path` ({"runs": []} where there is none yet); ValueError where it does not read."""
    manifest = atomic.read_json_object(path) if Path(path).exists() else {"runs": []}
    if not isinstance(manifest.get("runs"), list):
        raise ValueError(f"{path} holds no list of runs")
    return manifest


def append_run(result_dir, entry):
    """Add one command to `result_dir`/run.json, replacing the entry of the same run (same `started`)
    and any earlier run of the same command, whose files this one has overwritten."""
    path = Path(result_dir) / "run.json"
    manifest = read_manifest(path)
    manifest["runs"] = [run for run in manifest["runs"] if run.get("started") != entry.get("started")
                        and run.get("command") != entry.get("command")] + [entry]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, manifest, sort_keys=False)


def timed_with_xla(record):
    """Whether a bench or scaling record was timed with XLA (`xla`).

    Records from before the field were timed as Keras compiled by default on a
    CPU: TensorFlow's without XLA, JAX's with.
    """
    return record.get("xla", record["backend"] != "tensorflow")


def engine_text(records):
    """The sentence of the summary that says how the records' passes were compiled ("" for no records)."""
    if not records:
        return ""
    if records[0]["backend"] == "jax":
        return "JAX compiles every pass with XLA."
    with_xla = sum(map(timed_with_xla, records))
    if with_xla == len(records):
        return "TensorFlow's passes compiled with XLA, as train.py trains (`--jit-compile`, the default)."
    if not with_xla:
        return ("TensorFlow's passes compiled without XLA (Keras' default on a CPU, which this command took until "
                "2026-12-07 and takes with `--no-jit-compile`; train.py trains with XLA).")
    return (f"Mixed: {with_xla} of the {len(records)} records timed with XLA, the others without, so the tables "
            "below compare two engines.")


def series_key(record):
    """The kernel as plotted: 'softmax-fused' for fused softmax."""
    return f"{record['kernel']}-fused" if record.get("fused") else record["kernel"]


# === Plots ===


def plot_scaling(scaling, out_dir):
    """Per scope, time and peak memory against N on log-log axes.

    One figure per (scope, quantity), named by plot_name: rows are the modes,
    columns the positions, one line per kernel.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for scope in sorted({s["scope"] for s in scaling}):
        records = [s for s in scaling if s["scope"] == scope]
        positions = [p for p in POSITIONS if any(s["position"] == p for s in records)]
        for quantity, (_, label, scale) in QUANTITIES.items():
            figure = new_figure(4 * len(positions), 3.4 * len(MODES))
            axes = figure.subplots(len(MODES), len(positions), squeeze=False, sharex=True)
            for row, mode in enumerate(MODES):
                for col, position in enumerate(positions):
                    axis = axes[row][col]
                    for record in records:
                        if record["position"] != position:
                            continue
                        points = [(n, v * scale) for n, v in ok_points(record, mode, quantity) if v > 0]
                        if not points:
                            continue
                        # The fused softmax is softmax's colour, dashed.
                        colour, style = kernel_colour(record["kernel"]), "--" if record.get("fused") else "-"
                        axis.plot(*zip(*points), style, marker="o", markersize=3, color=colour,
                                  label=series_key(record))
                        failed = next((p for p in record["points"] if p.get(mode)
                                       and p[mode]["status"] in ("oom", "timeout", "error")), None)
                        if failed:  # a cross at the last measured value, at the N that failed
                            axis.plot([failed["tokens"]], [points[-1][1]], "x", color=colour, markersize=8)
                    axis.set_xscale("log", base=2)
                    axis.set_yscale("log")
                    axis.grid(True, which="both", alpha=0.3)
                    axis.set_title(f"{position}, {MODE_TITLE[mode]}", fontsize=10)
                    if col == 0:
                        axis.set_ylabel(label)
                    if row == len(MODES) - 1:
                        axis.set_xlabel("tokens N")
            legend = {}
            for axis in figure.axes:
                legend.update(zip(*reversed(axis.get_legend_handles_labels())))
            figure.legend(legend.values(), legend.keys(), loc="upper right", fontsize=8)
            figure.suptitle(f"{scope}: {label} against N (x: failed at that N)", fontsize=11)
            figure.tight_layout(rect=(0, 0, 0.9, 1))
            atomic.save_figure(figure, out_dir / plot_name(scope, quantity), dpi=90)


def plot_name(scope, quantity):
    """The file, in PLOTS, of plot_scaling's figure of `quantity` (a key of QUANTITIES) in `scope`."""
    return f"{scope}-{QUANTITIES[quantity][0]}.png"


# === Tables ===


def markdown_table(header, rows):
    return "\n".join(table_lines(header, rows))


def _number(value, digits=3):
    if value is None:
        return "—"
    if value == 0 or abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    return f"{value:.{max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))}f}"


def _mib(value):
    return "—" if value is None else f"{value / 2**20:,.0f}"


def _giga(value):
    return "—" if value is None else f"{value / 1e9:.3g}"


def _tokens(value):
    return f"{value:,.0f}"


def describe_crossover(result, linear_name, softmax_name):
    """A crossover dict (`scaling.crossover`) in words."""
    kind = result["kind"]
    if kind == "interpolated":
        low, high = result["between"]
        return f"≈ {_tokens(result['tokens'])} (between {_tokens(low)} and {_tokens(high)})"
    if kind == "below":
        return f"≤ {_tokens(result['tokens'])} (faster at every N)"
    if kind == "none":
        text = f"none up to N={_tokens(result['up_to'])}"
        if result.get("softmax_failed"):
            text += f"; {softmax_name} fails at {_tokens(result['softmax_failed'])}, {linear_name} runs"
        return text
    return "—"


def bench_section(bench):
    lines = []
    for dataset, size in sorted({(b["dataset"], b["size"]) for b in bench}):
        records = sorted((b for b in bench if (b["dataset"], b["size"]) == (dataset, size)), key=_variant_order)
        first = records[0]
        shape = "x".join(str(s) for s in first.get("image_shape") or []) or "?"
        lines += [
            f"### {dataset} resolution ({shape}, {first.get('tokens')} tokens), size `{first.get('size')}`",
            "",
            f"Training batch {first.get('batch_size')}; times are medians of warm steps. "
            "FLOPs per image from the compiled graph (training: forward + backward, no update) "
            "beside the analytic count of the forward matmuls.",
            "",
        ]
        rows = []
        for b in records:
            status = ", ".join(f"{k} {v}" for k, v in (b.get("status") or {}).items() if v != "ok") or "ok"
            rows.append([
                f"`{b['variant']}`", "—" if b.get("params") is None else f"{b['params']:,}", _number(b.get("train_step_ms")),
                _number(b.get("train_images_per_s")), _number(b.get("latency_ms_batch1")),
                _number(b.get("latency_ms_batch256")), _giga(b.get("train_flops_per_image")),
                _giga(b.get("inference_flops_per_image")), _giga(b.get("analytic_flops_per_image")),
                _mib(b.get("peak_memory_bytes")), _mib(b.get("inference_peak_memory_bytes")), status,
            ])
        lines += [markdown_table(
            ["variant", "params", "train ms/step", "images/s", "latency ms/img (b=1)", "latency ms/img (b=256)",
             "train GFLOP/img", "inference GFLOP/img", "analytic GFLOP/img", "train peak MiB",
             "inference peak MiB (b=256)", "status"], rows), ""]
        if any(b.get("top_operations") for b in records):  # a bench run with --trace-steps 0 has none
            rows = []
            for b in records:
                ops = b.get("top_operations") or []
                cells = [f"`{op['operation']}` ({op['type']}, {op['share']:.0%})" for op in ops[:3]]
                trace = b.get("trace_dir")
                rows.append([f"`{b['variant']}`", *(cells + ["—"] * (3 - len(cells))),
                             f"[trace]({trace})" if trace else "—"])
            lines += [
                "Most expensive operations of each variant in the profiler trace of "
                f"{first.get('trace_steps', '?')} training steps (self time, share of the busy time; "
                "names folded over blocks; view with `tensorboard --logdir <trace>`, Profile tab):",
                "",
                markdown_table(["variant", "1st", "2nd", "3rd", "trace"], rows), "",
            ]
        failed = [(b["variant"], k, b.get("status_detail", {}).get(k, "")) for b in records
                  for k, v in (b.get("status") or {}).items() if v != "ok"]
        if failed:
            lines += ["Failed measurements:", ""] + [f"- `{v}` {k}: {d}" for v, k, d in failed] + [""]
    return lines


def series_order(key):
    """Sort key of a series name ("favor", "softmax-fused"): the registry's kernel order, fused softmax after softmax."""
    kernel, _, fused = key.partition("-")
    return (list(KERNELS).index(kernel) if kernel in KERNELS else len(KERNELS), bool(fused))


def _variant_order(record):
    kernel = record.get("attention") or record.get("kernel") or ""
    position = record.get("position") or ""
    return (series_order(f"{kernel}-fused" if record.get("fused") else kernel),
            list(POSITIONS).index(position) if position in POSITIONS else len(POSITIONS))


def scaling_section(scaling):
    lines = []
    scopes = sorted({s["scope"] for s in scaling}, key=SCOPES.index)
    first = scaling[0]
    config = first["config"]
    lines += [
        f"Fixed width {config['width']}, {config['heads']} heads, m = {config['num_features']} features, "
        f"batch {config['batch_size']}; the model scope is the whole ViT with depth {config['depth']}, "
        f"MLP {config['mlp_dim']}, patch {config['patch_size']} (a grid of HxW patches is a "
        f"{config['patch_size']}H x {config['patch_size']}W image). N counts the CLS token. Per point: one "
        f"compiling call, then up to {first['steps']} timed calls (fewer past {first['max_seconds']:g} s; more, "
        f"up to {MAX_CALLS}, while they take under {CHEAP_SECONDS:g} s in all), median; a compiling call over "
        f"{first['max_seconds']:g} s is itself the measurement (marked * in the table below: it includes a "
        "second or two of tracing); "
        f"limits {first['time_limit_s']:g} s per point and {first['memory_limit_bytes'] / 2**30:g} GiB resident "
        "memory (over it: `oom`). Peak memory: "
        f"{_memory_method_text(first)}.",
        "",
    ]
    for scope in scopes:
        records = sorted((s for s in scaling if s["scope"] == scope), key=_variant_order)
        lines += [f"### {scope}: {'one KernelAttention layer' if scope == 'layer' else 'the whole ViT'}", ""]
        for quantity in QUANTITIES:
            lines += [f"![{scope} {quantity}]({PLOTS}/{plot_name(scope, quantity)})", ""]
        lines += _crossover_tables(records, scope)
        lines += _exponent_table(records)
        lines += _points_table(records)
        lines += _toeplitz_path_table(records)
    return lines


def _memory_method_text(record):
    points = [p[m] for p in record["points"] for m in MODES if p.get(m) and p[m].get("memory_method")]
    method = points[0]["memory_method"] if points else None
    return {
        "rss-hwm": "rise of the resident set (VmHWM after minus VmRSS before, heap trimmed and peak reset "
                   "first), which includes building the model",
        "tf-gpu-peak": "TensorFlow's GPU allocator peak",
        "jax-device-peak": "JAX device `peak_bytes_in_use`",
    }.get(method, method or "not measured")


def _baselines(records, linear):
    """(label, softmax series) to compare `linear` against: same position, absolute, fused."""
    by_name = {s["series"]: s for s in records}
    choices = [
        ("softmax, same position", by_name.get(f"softmax-{linear['position']}")),
        ("softmax-absolute", by_name.get("softmax-absolute")),
        ("fused softmax, same position", by_name.get(f"softmax-fused-{linear['position']}")),
    ]
    return [(label, s) for label, s in choices if s is not None]


def _crossover_tables(records, scope):
    linear = [s for s in records if s["kernel"] in linear_kernels()]
    if not linear:
        return []
    labels = []
    for s in linear:
        for label, _ in _baselines(records, s):
            if label not in labels:
                labels.append(label)
    lines = []
    for label in labels:
        rows = []
        for s in linear:
            baseline = dict(_baselines(records, s)).get(label)
            if baseline is None:
                continue
            rows.append([f"`{s['series']}`", f"`{baseline['series']}`", *(
                describe_crossover(crossover(s, baseline, mode), s["series"], baseline["series"]) for mode in MODES)])
        lines += [
            f"Crossover N from which the linear variant is faster than {label} ({scope}):", "",
            markdown_table(["linear variant", "against", "forward", "forward + backward"], rows), "",
        ]
    return lines


def _exponent_table(records):
    rows = []
    for s in records:
        fits = {(mode, quantity): fit_exponent(s, mode, quantity) for mode in MODES for quantity in ("ms", "peak_bytes")}
        cells = ["—" if fit is None else f"{fit['exponent']:.2f}" for fit in fits.values()]
        fit = fits[("forward", "ms")]
        span = "—" if fit is None else f"{_tokens(fit['from_tokens'])}–{_tokens(fit['to_tokens'])}"
        flops = fit_exponent(s, "forward", "flops")
        rows.append([f"`{s['series']}`", *cells, "—" if flops is None else f"{flops['exponent']:.2f}", span])
    return [
        f"Fitted exponent k of cost ~ N^k (least squares on log-log over the largest {FIT_POINTS} measured points):", "",
        markdown_table(["series", "forward time", "forward memory", "fwd+bwd time", "fwd+bwd memory",
                        "forward graph FLOPs", "N range (forward time)"], rows), "",
    ]


def _points_table(records):
    tokens = sorted({p["tokens"] for s in records for p in s["points"]})
    rows = []
    for s in records:
        cells = {p["tokens"]: p for p in s["points"]}
        row = [f"`{s['series']}`"]
        for n in tokens:
            point = cells.get(n)
            row.append("" if point is None else " / ".join(_cell(point.get(m)) for m in MODES))
        rows.append(row)
    return [
        "Milliseconds per call, forward / forward + backward (`oom`, `timeout`, `error`: failed there; "
        "`skip`: not run after a failure at a smaller N):", "",
        markdown_table(["series", *(f"N={_tokens(n)}" for n in tokens)], rows), "",
    ]


def _toeplitz_path_table(records):
    """Which exact KERPLE path each linear kerple series took at each N; none for files from before it was recorded."""
    records = [s for s in records if any((p.get(m) or {}).get("toeplitz_path") for p in s["points"] for m in MODES)]
    if not records:
        return []
    tokens = sorted({p["tokens"] for s in records for p in s["points"]})
    rows = []
    for s in records:
        paths = {p["tokens"]: next(filter(None, ((p.get(m) or {}).get("toeplitz_path") for m in MODES)), "")
                 for p in s["points"]}
        rows.append([f"`{s['series']}`", *(paths.get(n, "") for n in tokens)])
    return [
        "The exact path `toeplitz_path=\"auto\"` took (`toeplitz_path_used`; README, \"KERPLE's three paths\"):", "",
        markdown_table(["series", *(f"N={_tokens(n)}" for n in tokens)], rows), "",
    ]


def _cell(result):
    if not result:
        return ""
    if result["status"] == "ok":
        return _number(result["ms"]) + ("*" if result.get("cold") else "")
    return "skip" if result["status"] == "skipped" else result["status"]


def crossover_summary(scaling, scope="layer"):
    """{linear series: (softmax series, {mode: crossover dict})}, against softmax of the same
    position (fused when it was swept)."""
    records = sorted((s for s in scaling if s["scope"] == scope), key=_variant_order)
    summary = {}
    for s in records:
        if s["kernel"] not in linear_kernels():
            continue
        baselines = dict(_baselines(records, s))
        baseline = baselines.get("fused softmax, same position") or baselines.get("softmax, same position")
        if baseline is not None:
            summary[s["series"]] = (baseline["series"], {mode: crossover(s, baseline, mode) for mode in MODES})
    return summary


# === Summary ===


def write_summary(result_dir, results=None):
    """Write `result_dir`/summary.md and its plots from the JSON results there (`results`: load_results' answer,
    where the caller has it); returns the path."""
    result_dir = Path(result_dir)
    _, _, scaling, text = results or load_results(result_dir)
    if scaling:
        plot_scaling(scaling, result_dir / PLOTS)
    path = result_dir / "summary.md"
    atomic.write_text(path, text)
    return path


def summary_text(manifest, bench, scaling):
    """summary.md's text."""
    header = (bench or scaling or [{}])[0]
    # The date of the newest measurement, not of the writing: the summary is a function of its JSON files.
    finished = max((run["finished"] for run in manifest.get("runs", []) if run.get("finished")), default=None)
    measured = f", the newest measured on {finished[:10]}" if finished else ""
    engine = engine_text(bench + scaling)
    lines = [
        f"# Cost profiles: {header.get('device', '?')}, Keras backend {header.get('backend', '?')}",
        "",
        f"Keras {header.get('keras_version', '?')}, {header.get('backend', '?')} "
        f"{header.get('backend_version', '?')}. Written by `profiles/report.py` (`python -m profiles "
        f"--report-only`) from the JSON files beside it{measured}. {engine}{' ' if engine else ''}Produced by:",
        "",
    ]
    for run in manifest.get("runs", []):
        took = ""
        if run.get("finished") and run.get("started"):
            seconds = (datetime.datetime.fromisoformat(run["finished"])
                       - datetime.datetime.fromisoformat(run["started"])).total_seconds()
            took = f"  # {seconds / 60:.0f} min"
        lines += ["```", f"{run['command']}{took}", "```"]
    lines.append("")
    if scaling:
        lines += _headline(scaling)
    lines += _findings(bench, scaling)
    if bench:
        lines += ["## Per variant: the full ViT", ""] + bench_section(bench)
    if scaling:
        lines += ["## Scaling with the number of tokens N", ""] + scaling_section(scaling)
    return "\n".join(lines).rstrip() + "\n"


def _headline(scaling):
    """The crossover of every linear variant, in one place at the top."""
    lines = []
    for scope in SCOPES:
        summary = crossover_summary(scaling, scope)
        if not summary:
            continue
        against = "fused softmax" if any(s.get("fused") for s in scaling if s["scope"] == scope) else "softmax"
        lines += [f"Measured crossover N ({scope} scope) from which each linear variant is faster than "
                  f"{against} with the same position encoding:", ""]
        rows = [[f"`{name}`", *(describe_crossover(c[mode], name, baseline) for mode in MODES)]
                for name, (baseline, c) in summary.items()]
        lines += [markdown_table(["linear variant", "forward", "forward + backward"], rows), ""]
    return lines


def _findings(bench, scaling):
    """A few facts read off the tables, so the summary says what they show."""
    facts = []
    trained = [b for b in bench if b.get("train_step_ms")]
    for b in trained:
        if b["attention"] in linear_kernels():
            softmax = next((s for s in trained if s["attention"] == "softmax" and s["position"] == b["position"]
                            and (s["dataset"], s["size"], s["batch_size"]) == (b["dataset"], b["size"], b["batch_size"])),
                           None)
            ratio = softmax and b["train_step_ms"] / softmax["train_step_ms"]
            if ratio and ratio > 3:
                facts.append(
                    f"At {b['tokens']} tokens (`{b['size']}` ViT, {b['dataset']}), `{b['variant']}` trains "
                    f"{ratio:.0f}x slower than `{softmax['variant']}` ({_number(b['train_step_ms'])} vs "
                    f"{_number(softmax['train_step_ms'])} ms per step of {b['batch_size']} images).")
    for scope in SCOPES:
        records = [s for s in scaling if s["scope"] == scope]
        exponents = {}
        for s in records:
            fit = fit_exponent(s, "forward", "ms")
            if fit:
                exponents.setdefault(series_key(s), []).append((fit["exponent"], fit["to_tokens"]))
        if exponents:
            parts = [f"{kernel} {min(e for e, _ in fits):.2f}–{max(e for e, _ in fits):.2f}"
                     for kernel, fits in sorted(exponents.items(), key=lambda kv: series_order(kv[0]))]
            facts.append(f"Forward time of the {scope} grows as N^k over its largest measured points with k: "
                         + ", ".join(parts) + " (range over the positions).")
        failures = sorted({(p[m]["status"], s["series"], p["tokens"], m) for s in records for p in s["points"]
                           for m in MODES if p.get(m) and p[m]["status"] in ("oom", "timeout", "error")},
                          key=lambda f: (f[1], f[2]))
        if failures:
            limit = records[0]["memory_limit_bytes"] / 2**30
            facts.append(f"Failed {scope} points (`oom`: over the {limit:g} GiB limit): " + "; ".join(
                f"`{series}` {MODE_TITLE[mode]} {status} at N={_tokens(n)}" for status, series, n, mode in failures)
                + ". Larger N of the same mode were not run.")
    if any(b.get("backend") == "tensorflow" and b.get("position") == "kerple" for b in bench + scaling):
        facts.append("TensorFlow's profiler counts no FLOPs for FFT ops, so the graph FLOPs of a linear kernel's "
                     "kerple leave out the FFTs wherever it took the FFT path (the dense and DFT paths are matmuls "
                     "it counts; the analytic count leaves out every position's work).")
    if not any(s.get("fused") for s in scaling) and scaling:
        facts.append("Fused softmax (`--fused-softmax`, `ops.dot_product_attention`) was not swept here; "
                     "crossovers are against the explicit softmax.")
    return (["## Findings", ""] + [f"- {fact}" for fact in facts] + [""]) if facts else []

