"""The committed reports are what their commands write from the committed run folders.

A report left behind by older code, or run folders committed without a new
report, would show figures no command in the repository makes. Each profile's
aggregate.json and README.md are remade here from `results/` (figures into a
temporary folder, where no checkpoint is, as in a clone) and compared with the
committed files, and the top-level README must end with the committed
README_SECTION.md; the pilots' summary and the cost profiles' summary.md
likewise. The README's own summary of the cpu table may quote only numbers its
report holds. Seconds: nothing trains.
"""

import json
import re
import shutil
from pathlib import Path

import pytest

from experiments import aggregate, benchmark, pilots
from experiments.benchmark_profiles import PILOTS, get_profile
from experiments.report import write_readme_section, write_report
from profiles.report import write_summary

REPO = Path(__file__).resolve().parent.parent
RESULTS = "results"  # relative, as the commands in each report name it
PROFILES = sorted(path.parent.name for path in (REPO / RESULTS).glob("*/aggregate.json"))
COST_SUMMARIES = sorted(str(path.parent.relative_to(REPO)) for path in (REPO / "profiles/results").rglob("summary.md"))


def remade(name):
    """aggregate.json of profile `name` as `python -m experiments.report --profile name` makes it."""
    profile = get_profile(name)
    root = benchmark.profile_root(RESULTS, profile)
    cells = benchmark.cells(benchmark.all_jobs(profile, RESULTS))
    # Through JSON, as the command writes it: tuples become lists.
    return json.loads(json.dumps(aggregate.aggregate(root, cells, **benchmark.report_header(profile, RESULTS))))


@pytest.mark.parametrize("name", PROFILES)
def test_a_committed_report_is_what_its_command_writes(name, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    folder = REPO / RESULTS / name
    aggregated = remade(name)
    assert aggregated == json.loads((folder / "aggregate.json").read_text()), (
        f"results/{name}/aggregate.json is stale: run python -m experiments.report --profile {name}")
    readme = write_report(aggregated, tmp_path)
    assert readme.read_text() == (folder / "README.md").read_text(), (
        f"results/{name}/README.md is stale: run python -m experiments.report --profile {name}")


def test_the_readme_ends_with_the_results_section_of_the_committed_reports(tmp_path):
    for name in PROFILES:
        (tmp_path / RESULTS / name).mkdir(parents=True)
        shutil.copy(REPO / RESULTS / name / "aggregate.json", tmp_path / RESULTS / name)
    section = write_readme_section(tmp_path / RESULTS).read_text()
    assert section == (REPO / RESULTS / "README_SECTION.md").read_text()
    assert (REPO / "README.md").read_text().endswith("\n" + section)


def test_the_committed_pilot_summary_is_what_its_command_writes():
    root = REPO / RESULTS / pilots.PILOT_ROOT
    summaries = [pilots.summarize_pilot(root, setting) for setting in PILOTS if (root / setting).is_dir()]
    singles = pilots.single_runs(root, PILOTS)
    assert summaries, "no committed pilots"
    assert json.loads(json.dumps({"pilots": summaries, "single_runs": singles})) == json.loads(
        (root / "pilots.json").read_text()), "results/cpu-pilots/pilots.json is stale: run python -m experiments.pilots"
    assert pilots.render(summaries, singles) == (root / "README.md").read_text()


@pytest.mark.parametrize("folder", COST_SUMMARIES)
def test_a_committed_cost_summary_is_what_its_command_writes(folder, tmp_path):
    # A copy, because the summary's plots are drawn beside it.
    copy = shutil.copytree(REPO / folder, tmp_path / "profile")
    assert write_summary(copy).read_text() == (REPO / folder / "summary.md").read_text(), (
        f"{folder}/summary.md is stale: run python -c \"from profiles.report import write_summary; "
        f"write_summary('{folder}')\" (python -m profiles --report-only remakes this machine's folder only)")


# Quoted in the README's summary of the cpu table but not from its report: the earlier one-seed study's gap
# (softmax 77.67% against FAVOR+ 72.25% on CIFAR-10, issue 16), the study this table is built to check.
NOT_FROM_THE_REPORT = {"5.4"}


def readme_summary(heading):
    """The README's hand-written subsection that starts with `heading`, up to the next heading."""
    rest = (REPO / "README.md").read_text().split(heading, 1)[1]
    return heading + rest[:re.compile(r"^##", re.M).search(rest).start()]


@pytest.mark.parametrize("heading, profile", [("### What the `cpu` table says", "cpu"),
                                              ("### The first `reference` runs", "reference")])
def test_a_readme_summary_quotes_its_report(heading, profile):
    summary = readme_summary(heading)
    report = (REPO / RESULTS / profile / "README.md").read_text()
    quoted = set(re.findall(r"[+-]?\d+\.\d+", summary)) - NOT_FROM_THE_REPORT
    missing = sorted(number for number in quoted if number not in report)
    assert quoted and not missing, f"the README quotes numbers results/{profile}/README.md lacks: {missing}"


def test_the_readme_summary_of_the_cpu_table_counts_its_runs():
    summary = readme_summary("### What the `cpu` table says")
    runs = json.loads((REPO / RESULTS / "cpu" / "aggregate.json").read_text())["runs"]
    count = (f"all {runs['planned']} planned runs" if runs["finished"] == runs["planned"]
             else f"{runs['finished']} of the {runs['planned']} planned runs")
    assert count in summary


def test_every_finished_cpu_run_keeps_its_tensorboard_logs():
    # `tensorboard --logdir results/cpu` shows the whole study only if no run folder lacks its event files.
    finished = sorted(path.parent for path in (REPO / RESULTS / "cpu").rglob("metrics.json"))
    lacking = [str(folder.relative_to(REPO)) for folder in finished
               if not all(any((folder / "logs" / group).glob("events.out.tfevents*"))
                          for group in ("train", "validation", "test"))
               or not any((folder / "logs").glob("events.out.tfevents*"))]
    runs = json.loads((REPO / RESULTS / "cpu" / "aggregate.json").read_text())["runs"]
    assert len(finished) == runs["finished"] and not lacking, lacking


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_auto_uses_the_factors_fitted_to_every_committed_kerple_paths_profile(backend):
    """Each backend's `FFT_COST_FACTORS` and `DFT_COST_FACTORS` entries are `joint_factors` of every committed
    kerple_paths.json of the backend (to the digits they keep), a fit that every point allows, with the cost model
    of today's code; the README quotes them."""
    from performer_keras.kernel_attention import DFT_COST_FACTORS, FFT_COST_FACTORS
    from profiles import kerple_paths

    records = kerple_paths.committed_records()
    fit = kerple_paths.joint_factors(records, backend)
    assert fit["consistent"] and fit["margin"] > 1
    assert FFT_COST_FACTORS[backend] == round(fit["fft"], 1) and DFT_COST_FACTORS[backend] == round(fit["dft"], 2)
    # The files' model ratios are today's: a change of `toeplitz_costs` needs the profiles run again.
    for record in records:
        for shape in record["shapes"].values():
            for point in kerple_paths.timed(shape["points"]):
                for path in ("fft", "dft"):
                    if f"{path}_over_dense_model" in point:
                        assert point[f"{path}_over_dense_model"] == pytest.approx(
                            kerple_paths.model_ratio(point["patches"], shape["layer"], path)), record["command"]
    readme = (REPO / "README.md").read_text()
    assert f"{fit['margin']:.3f}" in readme.split("(`DFT_COST_FACTORS`; ", 1)[1][:1000]  # the margin it quotes
    for name, factors in (("FFT_COST_FACTORS", FFT_COST_FACTORS), ("DFT_COST_FACTORS", DFT_COST_FACTORS)):
        assert f"(`{name}`; " + ", ".join(f"{key}: {factor}" for key, factor in factors.items()) + ")" in readme


def test_the_dense_count_needs_its_elementwise_term_for_one_fft_factor_to_fit_jax_s_first_profile(monkeypatch):
    """Why `toeplitz_costs` counts the dense path's elementwise passes: without them (or with 16) no FFT factor
    picks the faster path at every point of JAX's first kerple_paths profile; with 64 one does, in an interval whose
    ends are 1.33 times apart (profiles/README.md)."""
    from performer_keras import kernel_attention
    from profiles import kerple_paths

    record = json.loads((REPO / "profiles/results/cpu-epyc-2core/jax/kerple_paths.json").read_text())
    assert record["command"].rstrip() == "KERAS_BACKEND=jax python -m profiles.kerple_paths"
    intervals = {}
    for term in (0, 16, kernel_attention.DENSE_ELEMENTWISE_COST):
        monkeypatch.setattr(kernel_attention, "DENSE_ELEMENTWISE_COST", term)
        points = [dict(point, fft_over_dense_model=kerple_paths.model_ratio(point["patches"], shape["layer"]))
                  for shape in record["shapes"].values() for point in kerple_paths.timed(shape["points"])]
        intervals[term] = kerple_paths.factor_interval(points)
    assert not intervals[0][2] and not intervals[16][2]
    low, high, consistent = intervals[kernel_attention.DENSE_ELEMENTWISE_COST]
    assert consistent and high / low > 1.3


def dft_term_fits(monkeypatch, term):
    """{set: joint_factors} of the committed kerple_paths files with `DFT_ELEMENTWISE_COST` = `term` (None: today's),
    for the three sets it must fit: TensorFlow's files timed without XLA (fitted alone as if they were the ones
    train.py's engine gave), and each backend's timed with XLA."""
    from performer_keras import kernel_attention
    from profiles import kerple_paths

    if term is not None:
        monkeypatch.setattr(kernel_attention, "DFT_ELEMENTWISE_COST", term)
    records = kerple_paths.committed_records()
    plain = [dict(record, xla=True) for record in records if not record["xla"]]
    return {"tensorflow without XLA": kerple_paths.joint_factors(plain, "tensorflow"),
            **{backend: kerple_paths.joint_factors(records, backend) for backend in ("tensorflow", "jax")}}


@pytest.mark.parametrize("term, consistent", [
    (0, {"tensorflow without XLA": False, "tensorflow": True, "jax": True}),
    (50, {"tensorflow without XLA": False, "tensorflow": True, "jax": True}),
    (100, {"tensorflow without XLA": True, "tensorflow": True, "jax": True}),
    (None, {"tensorflow without XLA": True, "tensorflow": True, "jax": True}),
    (450, {"tensorflow without XLA": True, "tensorflow": True, "jax": True}),
    (500, {"tensorflow without XLA": True, "tensorflow": False, "jax": True}),
    (600, {"tensorflow without XLA": True, "tensorflow": False, "jax": True}),
    (800, {"tensorflow without XLA": True, "tensorflow": False, "jax": True}),
    (850, {"tensorflow without XLA": True, "tensorflow": False, "jax": False}),
])
def test_the_dft_count_needs_its_elementwise_term_for_factors_to_fit_every_committed_profile(monkeypatch, term,
                                                                                             consistent):
    """Why `toeplitz_costs` counts the DFT path's passes besides its matmuls, and not too heavily: with 50 or less no
    factors fit TensorFlow's committed points timed without XLA; with 500 or more none fit TensorFlow's timed with
    XLA (since the family-25 model-1 EPYC's: 600 was the term before them), with 850 neither those nor JAX's;
    today's term (None) fits all three sets, as 100 and 450 do (kernel_attention's comment), paths within
    `kerple_paths.TIE` of each other's time counting as tied."""
    fits = dft_term_fits(monkeypatch, term)
    assert {name: fit["consistent"] for name, fit in fits.items()} == consistent


def test_the_dft_term_keeps_the_smallest_margin_of_the_three_sets_as_wide_as_any_term_in_steps_of_50(monkeypatch):
    """Among the terms that fit (above), today's is the one whose worst set has the widest margin, over terms from 0
    to 900 in steps of 50 (README and profiles/README.md quote the margins)."""
    from performer_keras.kernel_attention import DFT_ELEMENTWISE_COST

    def smallest_margin(term):
        return min(fit["margin"] for fit in dft_term_fits(monkeypatch, term).values())

    margins = {name: fit["margin"] for name, fit in dft_term_fits(monkeypatch, None).items()}
    readme = (REPO / "profiles" / "README.md").read_text().split("#### A third machine, held out", 1)[1]
    assert all(f"{margin:.3f}" in readme for margin in margins.values()), margins
    assert DFT_ELEMENTWISE_COST % 50 == 0 and min(margins.values()) > 1
    assert all(smallest_margin(term) < min(margins.values()) for term in range(0, 901, 50) if term != DFT_ELEMENTWISE_COST)


def test_auto_takes_the_faster_path_at_every_point_of_every_machine_s_kerple_paths_profile():
    """Each backend's factors pick the fastest path at every point of every committed kerple_paths.json timed with
    XLA, of every machine: one fit for all, though machines of one device name have differed five times in matmul
    rate (profiles/README.md, "How fast is this machine?")."""
    from profiles import kerple_paths

    records = kerple_paths.committed_records()
    for backend in ("tensorflow", "jax"):
        fitted = kerple_paths.fitted(records, backend)
        assert len(fitted) >= 3, backend
        for record in fitted:
            assert not kerple_paths.auto_mistakes(record), record["command"]
    # The rest are TensorFlow's timed without XLA (before `xla` was recorded), fitted to nothing.
    assert {(record["backend"], record["xla"]) for record in records} == {("jax", True), ("tensorflow", True),
                                                                          ("tensorflow", False)}
