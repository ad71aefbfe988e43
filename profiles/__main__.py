"""Profile ViT variants: per-variant cost, scaling in N, and a Markdown summary.

    python -m profiles                                    # all twelve variants
    python -m profiles favor-rope softmax-rope --tokens 64 256 1024 --scopes layer
    KERAS_BACKEND=jax python -m profiles --fused-softmax  # on a GPU: also flash softmax
    python -m profiles --report-only                      # rewrite summary.md from the JSON

Writes into <out>/<device>/<backend>/: bench/<variant>-<dataset>.json,
scaling/<scope>-<series>.json, traces/, plots/, run.json and summary.md
(see `profiles.report`). Each measurement runs in a child process under a
time and a memory limit; failures are recorded and the run goes on.
"""

import datetime
import shlex
import sys
from pathlib import Path

from performer_keras import atomic
from performer_keras.options import check_choice
from performer_keras.options import positive_int
from profiles import DEFAULT_PATCHES, SCOPES

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv=None):
    from performer_keras.cli import OneLineParser

    parser = OneLineParser(prog="python -m profiles", description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", metavar="VARIANT",
                        help="registry names such as favor-rope (default: the twelve of list_variants())")
    parser.add_argument("--datasets", nargs="+", default=["mnist"], choices=("mnist", "cifar10"),
                        help="resolutions of the per-variant bench (default mnist: 28x28x1, 50 tokens)")
    parser.add_argument("--size", default="reference", help="model size of the bench (default reference)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="training batch of the bench (default 32)")
    parser.add_argument("--burn-in", type=int, default=1, help="untimed steps after the compiling one (default 1)")
    parser.add_argument("--steps", type=positive_int, default=3, help="timed training steps (default 3)")
    parser.add_argument("--trace-steps", type=int, default=2, help="training steps traced by the profiler (0: none)")
    parser.add_argument("--tokens", type=positive_int, nargs="+", default=list(DEFAULT_PATCHES), metavar="N",
                        help="patches of the scaling grids (the CLS token adds one; default 64 .. 16384)")
    parser.add_argument("--model-tokens", type=positive_int, nargs="+", metavar="N",
                        help="patches for the model scope (default: --tokens)")
    parser.add_argument("--scopes", nargs="+", default=list(SCOPES), choices=SCOPES, help="scaling scopes")
    parser.add_argument("--fused-softmax", action="store_true",
                        help="also sweep softmax through ops.dot_product_attention (flash where available)")
    parser.add_argument("--width", type=positive_int, help="scaling width (default 64)")
    parser.add_argument("--heads", type=positive_int, help="scaling heads (default 2)")
    parser.add_argument("--num-features", type=positive_int, help="scaling random features m (default 64)")
    parser.add_argument("--scaling-steps", type=positive_int, default=3, help="timed calls per scaling point")
    parser.add_argument("--max-seconds", type=float, default=20.0,
                        help="stop timing a scaling point after this many seconds of calls (default 20)")
    parser.add_argument("--time-limit", type=float, default=180.0, help="seconds per scaling point (default 180)")
    parser.add_argument("--bench-time-limit", type=float, default=900.0,
                        help="seconds per stage of a variant's bench (default 900)")
    parser.add_argument("--memory-limit-gb", type=float, default=8.0,
                        help="resident memory of a measurement before it counts as out of memory (default 8)")
    parser.add_argument("--skip-bench", action="store_true", help="no per-variant bench")
    parser.add_argument("--skip-scaling", action="store_true", help="no scaling sweep")
    parser.add_argument("--resume", action="store_true", help="keep results whose JSON file already exists")
    parser.add_argument("--in-process", action="store_true",
                        help="measure in this process: faster, but no limits and no recovery from a crash")
    parser.add_argument("--report-only", action="store_true", help="only rewrite summary.md and the plots")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results root (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    command = "python -m profiles " + shlex.join(sys.argv[1:] if argv is None else argv)
    # Imported after parsing so that --help answers without loading a backend.
    import keras

    from performer_keras.cli import fail
    from performer_keras.registry import SIZES, list_variants, parse_variant
    from profiles import bench, report, scaling

    variants = args.variants or list_variants()
    try:
        for variant in variants:
            parse_variant(variant)
        check_choice("size", args.size, tuple(SIZES))
    except ValueError as err:
        return fail("python -m profiles", err)
    if args.out.exists() and not args.out.is_dir():
        return fail("python -m profiles", f"--out {args.out} is a file; give a folder")
    result_dir = args.out / bench.device_slug() / keras.backend.backend()
    if args.report_only:
        print(report.write_summary(result_dir))
        return 0
    failed = []
    started = datetime.datetime.now().isoformat(timespec="seconds")
    entry = dict(command=command, started=started, settings={k: str(v) if isinstance(v, Path) else v
                                                             for k, v in vars(args).items()})
    report.append_run(result_dir, entry)
    limits = dict(isolate=not args.in_process, memory_limit_bytes=int(args.memory_limit_gb * 2**30))
    print(f"profiles: {bench.device_name()}, backend {keras.backend.backend()} -> {result_dir}", flush=True)

    if not args.skip_bench:
        for dataset in args.datasets:
            for variant in variants:
                path = result_dir / "bench" / f"{variant}-{dataset}.json"
                if args.resume and path.exists():
                    continue
                trace_dir = result_dir / "traces" / f"{variant}-{dataset}"
                record = bench.profile_variant(
                    variant, dataset, args.size, args.batch_size, args.burn_in, args.steps, args.trace_steps,
                    trace_dir if args.trace_steps else None, time_limit_s=args.bench_time_limit, **limits)
                if record.get("trace_dir"):
                    record["trace_dir"] = str(Path(record["trace_dir"]).relative_to(result_dir))
                _write(path, record)
                if record["status"] != "ok":
                    failed.append(f"{variant}-{dataset}")
                print(f"bench {variant} {dataset}: {record['train_step_ms'] and round(record['train_step_ms'], 1)} "
                      f"ms/step, status {record['status']}", flush=True)

    if not args.skip_scaling:
        config = dict(scaling.SCALING_CONFIG)
        config.update({k: getattr(args, k) for k in ("width", "heads", "num_features") if getattr(args, k)})
        series = [(*parse_variant(v), False) for v in variants]
        if args.fused_softmax:
            series += [(kernel, position, True) for kernel, position, _ in series if kernel == "softmax"]
        for scope in args.scopes:
            patches = args.model_tokens if scope == "model" and args.model_tokens else args.tokens
            for kernel, position, fused in series:
                path = result_dir / "scaling" / f"{scope}-{scaling.series_name(kernel, position, fused)}.json"
                if args.resume and path.exists():
                    continue
                record = scaling.run_series(
                    scope, kernel, position, fused, patches, config=config, steps=args.scaling_steps, max_seconds=args.max_seconds,
                    time_limit_s=args.time_limit, points_per_child=_points_per_child(), log=_log_point, **limits)
                _write(path, record)

    entry["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    report.append_run(result_dir, entry)
    print(report.write_summary(result_dir))
    if failed:
        print(f"python -m profiles: the bench of {', '.join(failed)} did not finish (status in its JSON)", file=sys.stderr)
        return 1
    return 0


def _points_per_child():
    """1 where peak memory cannot be reset between points (JAX on a GPU), else all in one child."""
    import keras

    if keras.backend.backend() != "jax":
        return None
    import jax

    return 1 if jax.devices()[0].platform != "cpu" else None


def _log_point(scope, series, patches, mode, result):
    value = f"{result['ms']:.2f} ms, {result['peak_bytes'] / 2**20:.0f} MiB" if result["status"] == "ok" else ""
    print(f"scaling {scope} {series} N={patches + 1} {mode}: {result['status']} {value}".rstrip(), flush=True)


def _write(path, record):
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, record, indent=1)


if __name__ == "__main__":
    sys.exit(main())
