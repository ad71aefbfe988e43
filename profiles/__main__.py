"""Profile ViT variants: per-variant cost, scaling in N, and a Markdown summary.

    python -m profiles                                    # all twelve variants
    python -m profiles favor-rope softmax-rope --tokens 64 256 1024 --scopes layer
    KERAS_BACKEND=jax python -m profiles --fused-softmax  # on a GPU: also flash softmax
    python -m profiles --report-only                      # rewrite summary.md from the JSON

Writes into <out>/<device>/<backend>/: bench/<variant>-<dataset>.json,
scaling/<scope>-<series>.json, traces/, plots/, run.json and summary.md
(see `profiles.report`). Each measurement runs in a child process under a
time and a memory limit; failures are recorded and the run goes on.
TensorFlow's passes compile with XLA, as train.py trains (`--no-jit-compile`:
without, Keras' default on a CPU; JAX always compiles with XLA); every record
says which (`xla`), and a folder holds one or the other, so that its summary
never compares the two.
The bench measures size reference at batch 32 at MNIST's resolution unless
--size, --batch-size or --datasets say otherwise; --out is profiles/results.
--width, --heads and --num-features shape the scaling sweep's models (by
default width 64, 2 heads, m = 64: `profiles.scaling.SCALING_CONFIG`), not
the bench's. An option that the parts of the command which run do not read
is refused, as is a shape the sweep cannot build.
"""

import datetime
import sys
from pathlib import Path

from experiments import atomic
from experiments.cli import Distinct, command_line, expand_variants, fail, interruptible, parser, variant_arg
from performer_keras.options import check_choice
from performer_keras.registry import list_variants, model_config, parse_variant
from profiles import BENCH_BATCH, BENCH_DATASETS, BENCH_SIZE, DEFAULT_PATCHES, SCOPES

PROG = "python -m profiles"
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
OPTIONS = (
    "datasets", "size", "batch-size", "burn-in", "steps", "trace-steps", "tokens", "model-tokens", "scopes",
    "fused-softmax", "width", "heads", "num-features", "scaling-steps", "max-seconds", "time-limit",
    "bench-time-limit", "memory-limit-gb", "skip-bench", "skip-scaling", "resume", "in-process", "report-only", "out",
    "jit-compile",
)
DEFAULTS = dict(datasets=[BENCH_DATASETS[0]], size=BENCH_SIZE, batch_size=BENCH_BATCH, tokens=list(DEFAULT_PATCHES),
                scopes=list(SCOPES), out=DEFAULT_OUT)
# The options only one part reads: given where that part does not run, each would change nothing, silently.
READ_BY = {
    "bench": ("datasets", "size", "batch_size", "burn_in", "steps", "trace_steps", "bench_time_limit"),
    "scaling": ("tokens", "model_tokens", "scopes", "fused_softmax", "width", "heads", "num_features", "scaling_steps",
                "max_seconds", "time_limit"),
}


def unread_option(cli, args):
    """A message naming an option that changes nothing in this command, else None.

    An option counts as given where it differs from its default (argparse
    keeps no other trace); the defaults of `DEFAULTS` are not filled in yet.
    """
    given = [dest for dest in (name.replace("-", "_") for name in OPTIONS) if getattr(args, dest) != cli.get_default(dest)]
    if args.report_only:
        ignored = [dest for dest in given if dest not in ("report_only", "out")]
        if ignored or args.variants:
            what = f"--{ignored[0].replace('_', '-')}" if ignored else "VARIANT"
            return f"{what} changes nothing with --report-only, which rewrites summary.md and the plots"
    for part, skipped, reader in (("bench", args.skip_bench, "the per-variant bench"),
                                  ("scaling", args.skip_scaling, "the scaling sweep; the bench measures --size as it is")):
        ignored = [dest for dest in given if dest in READ_BY[part]] if skipped else []
        if ignored:
            return f"--{ignored[0].replace('_', '-')} changes nothing with --skip-{part}; it applies to {reader}"
    if args.model_tokens and "model" not in (args.scopes or SCOPES):
        return "--model-tokens changes nothing without the model scope in --scopes"
    if args.fused_softmax and not any(parse_variant(v)[0] == "softmax" for v in expand_variants(args.variants, list_variants())):
        return "--fused-softmax changes nothing without a softmax variant"
    return None


def parse_args(argv=None):
    """The command line with the defaults of `DEFAULTS` filled in; bad values exit 2 with one line."""
    cli = parser(PROG, __doc__, *OPTIONS)
    cli.add_argument("variants", type=variant_arg, nargs="*", action=Distinct, metavar="VARIANT",
                     help="registry names such as favor-rope, or all (default: the twelve of list_variants())")
    args = cli.parse_args(argv)
    unread = unread_option(cli, args)
    if unread:
        cli.exit(fail(PROG, unread))
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    # Absolute: the measuring children run in the repository's root (profiles/child.py), so a relative
    # --out would put their traces there and the rest of the results here.
    args.out = Path(args.out).resolve()
    args.variants = expand_variants(args.variants, list_variants())
    try:
        model_config(args.size)  # the bench's; the sweep's shape is checked by building it (`run`)
        for dataset in args.datasets:
            check_choice("dataset", dataset, BENCH_DATASETS)
        for scope in args.scopes:
            check_choice("scope", scope, SCOPES)
    except ValueError as error:
        cli.exit(fail(PROG, error))
    if args.skip_bench and args.skip_scaling and not args.report_only:  # else a run that measured nothing joins run.json
        cli.exit(fail(PROG, "--skip-bench and --skip-scaling together leave nothing to measure; --report-only "
                            "rewrites the summary from the results there"))
    return args


def main(argv=None):
    args = parse_args(argv)
    return interruptible(PROG, lambda: run(args, argv))


def run(args, argv):
    # Imported after parsing so that --help and bad input answer without loading a backend.
    import keras

    from experiments.training import passes_with_xla
    from profiles import bench, report, scaling

    try:
        xla = passes_with_xla(args.jit_compile)
    except ValueError as error:
        return fail(PROG, error)
    backend = keras.backend.backend()
    command = command_line("profiles", argv)
    variants = args.variants
    result_dir = args.out / bench.device_slug() / backend
    try:  # a results file damaged by hand or disk stops the command now, not after its measurements
        results = report.load_results(result_dir)
    except ValueError as error:
        return fail(PROG, f"{error}: mend it or remove it")
    manifest, bench_records, scaling_records, _ = results
    if args.report_only:
        if not (manifest["runs"] or bench_records or scaling_records):
            # Else a mistyped --out, or another backend, gets a summary of nothing.
            return fail(PROG, f"{result_dir} holds no profile results to summarise; run {PROG} first "
                              "(the folder is per device and Keras backend)")
        print(report.write_summary(result_dir, results))
        return 0
    other = next((record for record in bench_records + scaling_records if report.timed_with_xla(record) != xla), None)
    if other:  # else one summary would compare timings of two engines
        return fail(PROG, f"{result_dir} holds results timed {'with' if not xla else 'without'} XLA "
                          f"({other.get('variant') or other['series']}); give another --out, or "
                          f"{'add' if xla else 'leave out'} --no-jit-compile")
    if not args.skip_scaling:
        config = dict(scaling.SCALING_CONFIG)
        config.update({k: getattr(args, k) for k in ("width", "heads", "num_features") if getattr(args, k)})
        grid = scaling.grid_for(min(args.tokens))
        for kernel, position in map(parse_variant, variants):
            try:  # the layers' own checks (heads dividing the width, rope's multiple of 4), before anything is written
                scaling.build_subject("layer", kernel, position, grid, config=config)
            except ValueError as error:
                return fail(PROG, f"the scaling sweep cannot build {kernel}-{position}: {error}")
    failed = []
    started = datetime.datetime.now().isoformat(timespec="seconds")
    entry = dict(command=command, started=started, settings={k: str(v) if isinstance(v, Path) else v
                                                             for k, v in vars(args).items()})
    report.append_run(result_dir, entry)
    limits = dict(isolate=not args.in_process, memory_limit_bytes=int(args.memory_limit_gb * 2**30))
    print(f"profiles: {bench.device_name()}, backend {backend}{', XLA' if xla else ''} -> {result_dir}", flush=True)

    if not args.skip_bench:
        for dataset in args.datasets:
            for variant in variants:
                # Sizes other than the default keep their own files, so one folder holds both.
                name = f"{variant}-{dataset}" + ("" if args.size == BENCH_SIZE else f"-{args.size}")
                path = result_dir / "bench" / f"{name}.json"
                if args.resume and path.exists():
                    continue
                trace_dir = result_dir / "traces" / name
                record = bench.profile_variant(
                    variant, dataset, args.size, args.batch_size, args.burn_in, args.steps, args.trace_steps,
                    trace_dir if args.trace_steps else None, time_limit_s=args.bench_time_limit, jit_compile=xla,
                    **limits)
                if record.get("trace_dir"):
                    record["trace_dir"] = str(Path(record["trace_dir"]).relative_to(result_dir))
                _write(path, record)
                if any(state != "ok" for state in record["status"].values()):
                    failed.append(f"{variant}-{dataset}")
                print(f"bench {variant} {dataset}: {record['train_step_ms'] and round(record['train_step_ms'], 1)} "
                      f"ms/step, status {record['status']}", flush=True)

    if not args.skip_scaling:
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
                    time_limit_s=args.time_limit, points_per_child=_points_per_child(), log=_log_point, jit_compile=xla,
                    **limits)
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
