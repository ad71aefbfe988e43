"""A user's own images as a keras.datasets-layout .npz: train.py end to end, and the bad files it refuses."""

import hashlib
import json

import numpy as np
import pytest

import train
from experiments import data

TINY = ["--size", "tiny", "--batch-size", "16", "--epochs", "1", "--patch-size", "4"]


def write_npz(path, shape, classes=(30, 12, 5), test=20, **overrides):
    """Uneven classes (30, 12 and 5 training images); random uint8 pixels."""
    rng = np.random.default_rng(0)
    y_train = np.concatenate([np.full(n, c) for c, n in enumerate(classes)]).astype(np.int64)
    arrays = dict(
        x_train=rng.integers(0, 256, (len(y_train), *shape), dtype=np.uint8), y_train=y_train,
        x_test=rng.integers(0, 256, (test, *shape), dtype=np.uint8), y_test=np.arange(test) % len(classes),
        label_names=np.array([f"class{c}" for c in range(len(classes))]),
    )
    arrays.update(overrides)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


@pytest.mark.parametrize("shape, augment", [((16, 16), "rotate"), ((16, 16, 3), "crop_flip")])
def test_train_py_trains_on_an_npz(tmp_path, shape, augment):
    npz = write_npz(tmp_path / "mine.npz", shape)
    splits = data.load_dataset(str(npz))
    assert splits.image_shape == (16, 16, shape[2] if len(shape) == 3 else 1)
    assert splits.label_names == ("class0", "class1", "class2") and splits.num_classes == 3
    assert data.augmentation_for(str(npz), splits.image_shape[-1]) == augment
    out = tmp_path / "run"
    assert train.main(["--dataset", str(npz), *TINY, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_examples"] == 20 and len(metrics["per_class"]) == 3
    assert metrics["per_class"][0]["class"] == "class0"


def test_augment_overrides_the_default(tmp_path):
    npz = write_npz(tmp_path / "mine.npz", (16, 16))
    out = tmp_path / "run"
    assert train.main(["--dataset", str(npz), *TINY, "--augment", "none", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["augment"] == "none"


BAD = {
    "no x_train": dict(x_train=None),
    "labels do not match images": dict(y_train=np.zeros(3, np.int64)),
    "float images": dict(x_test=np.zeros((20, 16, 16), np.float32)),
    "negative labels": dict(y_test=-np.ones(20, np.int64)),
    "sizes differ": dict(x_test=np.zeros((20, 8, 8), np.uint8)),
    "too few label names": dict(label_names=np.array(["a"])),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_npz_exits_2_with_one_line_naming_the_file(tmp_path, capsys, case):
    npz = write_npz(tmp_path / "bad.npz", (16, 16), **BAD[case])
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    capsys.readouterr()
    code = train.main(["--dataset", str(npz), *TINY, "--out", str(tmp_path / "run")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "bad.npz" in lines[0], lines
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()} == before


def test_a_file_that_is_not_an_npz_is_refused(tmp_path, capsys):
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    capsys.readouterr()
    assert train.main(["--dataset", str(tmp_path / "junk.npz"), *TINY, "--out", str(tmp_path / "run")]) == 2
    assert "junk.npz: not a readable .npz" in capsys.readouterr().err
