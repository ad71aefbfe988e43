"""A user's own images as a keras.datasets-layout .npz: train.py end to end, and the bad files it refuses."""

import hashlib
import json
import shutil

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
    "one class": dict(y_train=np.zeros(47, np.int64), y_test=np.zeros(20, np.int64), label_names=None),
    "a test class never trained on": dict(y_test=np.arange(20) % 4),
    "label ids, not 0 to K-1": dict(y_train=np.repeat([0, 1000, 2000], [30, 12, 5]), y_test=np.arange(20) % 3 * 1000,
                                    label_names=None),
    "repeated label names": dict(label_names=np.array(["cat", "dog", "cat"])),
    "label names of another shape": dict(label_names=np.array([["cat", "dog", "emu"]])),
    "Python objects": dict(label_names=np.array([{"name": "cat"}, "dog", "emu"], dtype=object)),
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


def test_a_constant_channel_is_standardised_to_zero_and_trains(tmp_path):
    images = np.random.default_rng(2).integers(0, 256, (47, 16, 16, 3), dtype=np.uint8)
    images[..., 2] = 255  # an alpha-like channel, the same in every image
    npz = write_npz(tmp_path / "rgba_like.npz", (16, 16, 3), x_train=images)
    splits = data.load_dataset(str(npz))
    assert splits.std[2] == 1.0 and splits.mean[2] == 255.0
    assert splits.std[0] == pytest.approx(splits.train[0][..., 0].std())
    out = tmp_path / "run"
    assert train.main(["--dataset", str(npz), *TINY, "--out", str(out)]) == 0
    assert np.isfinite(json.loads((out / "metrics.json").read_text())["test_accuracy"])


@pytest.mark.parametrize("kind", ["junk", "npy"])
def test_a_file_that_is_not_an_npz_is_refused(tmp_path, capsys, kind):
    # A .npy under an .npz name ended in a traceback (np.load returns an array); other bytes were told as
    # pickled data that the user could load unsafely.
    if kind == "npy":
        np.save(tmp_path / "x.npy", np.zeros((3, 28, 28), np.uint8))
        (tmp_path / "x.npy").rename(tmp_path / "junk.npz")
    else:
        (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    capsys.readouterr()
    assert train.main(["--dataset", str(tmp_path / "junk.npz"), *TINY, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "junk.npz: not a .npz (no zip archive: a .npy, damaged, or another format)" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind", ["missing folder", "missing under ~", "a file of another kind"])
def test_a_path_that_is_no_dataset_is_named_as_such_not_sent_to_tfds(tmp_path, capsys, monkeypatch, kind):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "notes.txt").write_text("not images")
    dataset, expected = {
        "missing folder": (str(tmp_path / "no_such_folder"), "no such file or folder"),
        "missing under ~": ("~/no_such_folder", "no such file or folder"),
        "a file of another kind": (str(tmp_path / "notes.txt"), "neither a .npz file nor a folder of images"),
    }[kind]
    monkeypatch.setattr(data, "_read_tfds", lambda name: pytest.fail(f"{name} was sent to tensorflow-datasets"))
    capsys.readouterr()
    assert train.main(["--dataset", dataset, *TINY, "--out", str(tmp_path / "run")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0] and repr(dataset) in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_a_folder_under_home_is_read_with_tilde_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_folder(tmp_path / "pets")
    splits = data.load_dataset("~/pets")
    assert splits.label_names == ("cat", "dog", "emu")
    assert data.augmentation_for("~/pets", channels=1) == "rotate"
    assert data.augmentation_for("~/pets", channels=3) == "crop_flip"


# === A folder of images, one subfolder per class ===


def write_folder(root, mode="L", size=(16, 12), classes=("cat", "dog", "emu"), counts=(9, 6, 5), splits=("train", "test")):
    """PNG and JPEG images of `mode` under root/<split>/<class>/ (splits=() writes root/<class>/);
    returns {(split, class): [pixel arrays as written]} to compare with what was read."""
    from PIL import Image

    rng = np.random.default_rng(1)
    written = {}
    for split in splits or ("",):
        for name, count in zip(classes, counts):
            folder = root / split / name
            folder.mkdir(parents=True)
            (folder / "notes.txt").write_text("not an image: ignored")
            for i in range(count if split != "test" else 3):
                channels = () if mode == "L" else (3,)
                pixels = rng.integers(0, 256, (size[1], size[0], *channels), dtype=np.uint8)
                # PNG is lossless, so the pixels read back are the pixels written.
                Image.fromarray(pixels, mode).save(folder / f"{i}.png")
                written.setdefault((split, name), []).append(pixels)
    return written


def test_a_folder_with_train_and_test_is_read_by_pillow_in_class_order(tmp_path):
    written = write_folder(tmp_path / "pets")
    x_train, y_train, x_test, y_test, names = data._read_folder(tmp_path / "pets", 42)
    assert names == ("cat", "dog", "emu")
    assert x_train.shape == (20, 12, 16, 1) and x_test.shape == (9, 12, 16, 1)
    assert list(np.bincount(y_train)) == [9, 6, 5] and list(np.bincount(y_test)) == [3, 3, 3]
    dogs = x_train[y_train == 1][..., 0]
    np.testing.assert_array_equal(dogs, np.stack(written[("train", "dog")]))


def test_colour_images_make_every_image_rgb_and_train_py_crops_and_flips(tmp_path):
    write_folder(tmp_path / "pets", mode="RGB", size=(16, 16))
    splits = data.load_dataset(str(tmp_path / "pets"))
    assert splits.image_shape == (16, 16, 3) and splits.label_names == ("cat", "dog", "emu")
    assert data.augmentation_for(str(tmp_path / "pets"), 3) == "crop_flip"
    out = tmp_path / "run"
    assert train.main(["--dataset", str(tmp_path / "pets"), *TINY, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_examples"] == 9 and metrics["per_class"][2]["class"] == "emu"


def test_a_16_bit_png_keeps_its_high_byte_as_tensorflows_decoder_does_and_grey_with_alpha_stays_grey(tmp_path):
    from PIL import Image

    write_folder(tmp_path / "pets", size=(16, 16))
    deep = np.arange(256, dtype=np.uint16).reshape(16, 16) * 257  # 0 to 65535
    Image.fromarray(deep).save(tmp_path / "pets" / "train" / "cat" / "0.png")
    Image.fromarray(np.stack([deep.astype(np.uint8), np.full((16, 16), 9, np.uint8)], -1), "LA").save(
        tmp_path / "pets" / "train" / "dog" / "0.png")
    x_train, y_train, *_ = data._read_folder(tmp_path / "pets", 42)
    assert x_train.shape[-1] == 1
    # Pillow's own convert("L") would clip: every pixel from 255 up would read 255.
    np.testing.assert_array_equal(x_train[y_train == 0][0, ..., 0], deep >> 8)
    np.testing.assert_array_equal(x_train[y_train == 1][0, ..., 0], deep.astype(np.uint8))


def test_a_folder_of_class_folders_is_split_with_the_fixed_seed(tmp_path):
    write_folder(tmp_path / "pets", size=(16, 16), splits=())
    first, again = (data._read_folder(tmp_path / "pets", 42) for _ in range(2))
    for a, b in zip(first[:4], again[:4]):
        np.testing.assert_array_equal(a, b)
    # 20% of each class (at least one image) is the test split.
    assert list(np.bincount(first[3])) == [2, 1, 1] and list(np.bincount(first[1])) == [7, 5, 4]
    assert data.augmentation_for(str(tmp_path / "pets"), 1) == "rotate"


def _break(root, case):
    from PIL import Image

    if case == "corrupt image":
        (root / "train" / "dog" / "3.png").write_bytes(b"\x89PNG but not really")
        return "3.png"
    if case == "empty class folder":
        for path in (root / "test" / "emu").iterdir():
            path.unlink()
        return "emu"
    if case == "float pixels":
        # Pillow reads a file by its content: a TIFF of floats under a .png name opens in mode F.
        Image.fromarray(np.full((16, 16), 0.5, np.float32)).save(root / "train" / "dog" / "2.png", format="TIFF")
        return "2.png"
    if case == "sizes differ":
        Image.fromarray(np.zeros((5, 5), np.uint8), "L").save(root / "test" / "cat" / "9.png")
        return "9.png"
    if case == "classes differ":
        (root / "test" / "emu").rename(root / "test" / "eel")
        return "pets"
    if case == "one class":
        for split in ("train", "test"):
            for name in ("dog", "emu"):
                shutil.rmtree(root / split / name)
        return "pets: one class (cat)"
    if case == "no test folder":
        for path in (root / "test").rglob("*"):
            if path.is_file():
                path.unlink()
        for folder in sorted((root / "test").iterdir()):
            folder.rmdir()
        (root / "test").rmdir()
        return "pets"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["corrupt image", "float pixels", "empty class folder", "sizes differ",
                                  "classes differ", "no test folder", "one class"])
def test_a_bad_folder_exits_2_with_one_line_naming_the_file(tmp_path, capsys, case):
    write_folder(tmp_path / "pets", size=(16, 16))
    named = _break(tmp_path / "pets", case)
    capsys.readouterr()
    code = train.main(["--dataset", str(tmp_path / "pets"), *TINY, "--out", str(tmp_path / "run")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and named in lines[0], lines
    assert not (tmp_path / "run").exists()
