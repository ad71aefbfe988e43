"""The house rules (STYLE rule 12): the library apart from the harness, options defined once.

- `performer_keras` imports nothing of the harness, and the harness no script;
- importing the library, the option table or a run config loads no Keras, no
  TensorFlow and no JAX (a real process: what is imported is the point);
- every `--option` of every tool is declared in `experiments/cli.py` alone;
- a tool that loads TensorFlow still fails in exactly one line on stderr.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"train", "evaluate"}
HARNESS = {"experiments", "tuning", "profiles"}


def imported_modules(path):
    """Top-level names of every module `path` imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def sources(*folders):
    return [path for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))]


def test_arrows_run_one_way():
    for path in sources("performer_keras"):
        assert not imported_modules(path) & (HARNESS | SCRIPTS), f"the library's {path.name} imports the harness"
    for path in sources(*HARNESS):
        assert not imported_modules(path) & SCRIPTS, f"{path.relative_to(ROOT)} imports a script"


def test_the_library_and_the_option_table_load_no_backend():
    code = (
        "import sys\n"
        "import performer_keras, experiments, experiments.cli, experiments.run_config, experiments.benchmark_profiles\n"
        "import performer_keras.registry, performer_keras.options\n"
        "print(sorted(m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_every_option_is_declared_once_in_the_option_table():
    from experiments.cli import OPTIONS

    for path in sources(*HARNESS) + [ROOT / "train.py", ROOT / "evaluate.py"]:
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                flags = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
                assert not any(flag.startswith("-") for flag in flags), f"{path.name} declares {flags} itself"
    assert all(name == name.lower() and not name.startswith("-") for name in OPTIONS)


def test_every_list_option_drops_its_repeats_in_order():
    from experiments import cli

    # A seed, dataset, epoch or token count named twice trained, kept or measured the same thing twice.
    lists = {name for name, keywords in cli.OPTIONS.items() if keywords.get("nargs") in ("+", "*")}
    assert {"seeds", "datasets", "keep-epochs", "tokens", "variants"} <= lists
    assert all(cli.OPTIONS[name]["action"] is cli.Distinct for name in lists)
    positional = []
    for path in sources(*HARNESS):  # the tools' own list arguments
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                keywords = {keyword.arg: keyword.value for keyword in node.keywords}
                if getattr(keywords.get("nargs"), "value", None) in ("+", "*"):
                    positional.append(path.name)
                    assert getattr(keywords.get("action"), "id", None) == "Distinct", f"{path.name}: {ast.unparse(node)}"
    assert {"favor_floor.py", "__main__.py"} <= set(positional)
    parsed = cli.parser("tool", "", "seeds", "datasets", "keep-epochs", "tokens").parse_args(
        ["--seeds", "2", "0", "2", "--datasets", "mnist", "cifar10", "mnist", "--keep-epochs", "3", "1", "3",
         "--tokens", "64", "64"])
    assert (parsed.seeds, parsed.datasets, parsed.keep_epochs, parsed.tokens) == ([2, 0], ["mnist", "cifar10"], [3, 1], [64])


@pytest.mark.slow
def test_a_tool_that_loaded_tensorflow_still_fails_in_one_line():
    result = subprocess.run(
        [sys.executable, "train.py", "--size", "tiny", "--dataset", "no_such_dataset_xyz"],
        cwd=ROOT, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("train.py: error:"), result.stderr


# The single-purpose measurements, each of which imports Keras before it parses its command line.
SINGLE_TOOLS = ("profiles.engine", "profiles.precision", "profiles.kerple_cost", "profiles.kerple_paths",
                "profiles.favor_estimator", "profiles.xla_cost", "profiles.batch_sum", "profiles.matmul_rate",
                "experiments.pilots", "experiments.favor_floor", "experiments.rebuild_logs")


@pytest.mark.slow
def test_the_single_purpose_tools_refuse_a_bad_argument_in_one_line():
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    # A positional argument where the tool requires one, so that argparse reaches the unknown option.
    positional = {"experiments.favor_floor": ["model.keras"], "experiments.rebuild_logs": ["run"]}
    running = {tool: subprocess.Popen([sys.executable, "-m", tool, *positional.get(tool, []), "--no-such-option"],
                                      cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for tool in SINGLE_TOOLS}
    for tool, process in running.items():
        stderr = process.communicate(timeout=300)[1]
        assert process.returncode == 2, (tool, stderr)
        assert len(stderr.strip().splitlines()) == 1 and "error: unrecognized arguments" in stderr, (tool, stderr)


def test_python_m_profiles_still_parses_before_any_backend():
    # -X importtime lists every module imported, on stderr: the parent of the profiles loads none of Keras.
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "profiles", "--no-such-option"], cwd=ROOT,
                            capture_output=True, text=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert result.returncode == 2 and "profiles" in imported, result.stderr[-2000:]
    assert not {name.split(".")[0] for name in imported} & {"keras", "tensorflow", "jax"}
