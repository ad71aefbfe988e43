"""Datasets for training and evaluating the ViTs, as uint8 numpy arrays.

MNIST and CIFAR-10 ship in the repository's ``data/`` folder (see
``data/README.md``), so that training needs no network and every published
figure is reproduced on exactly these bytes; each load checks the file's sha256
first, so a damaged copy fails with one line instead of quietly training on
garbage. Any other name goes through tensorflow-datasets.

Three decisions shape the module:

* The validation split is drawn from the training set with a fixed numpy
  permutation (``split_seed``), so model selection never looks at the test set
  and every run, on every machine, validates on the same examples. All three
  splits come in a fixed random order, so that the first ``limit`` examples of
  any split are a fair sample (the CIFAR-10 file is grouped by class).
* The training order of epoch ``k`` is a pure function of ``(seed, k)``
  (`epoch_order`; the augmentation is one too, see `augment.py`), so a run
  resumed after a crash at epoch ``k`` sees the very batches the uninterrupted
  run would have seen. `pipelines.py` turns the arrays into batches.
* Nothing here needs TensorFlow (JPEGs are decoded by Pillow), so a JAX
  machine without it loads the same data; only tensorflow-datasets names
  import it.
"""

import dataclasses
import hashlib
import io
import logging
import os
import socket
import warnings
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from experiments.cli import import_quietly
from performer_keras.options import check_positive

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
BUNDLED = ("mnist", "cifar10")

_FILES = {"mnist": "mnist.npz", "cifar10": "cifar10_jpeg.npz"}
# From data/README.md; a file whose digest differs is not the published data.
_SHA256 = {
    "mnist.npz": "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64",
    "cifar10_jpeg.npz": "12fc5d91bf6b428acc62b03ce3409030db35154c4241d65a1b539d23ab9d6b8d",
}
# Decoded CIFAR-10 lives outside the repository, keyed by the source checksum,
# so it is never committed and a changed source file can never hit a stale cache.
CACHE_DIR = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "performer_keras"
)
_VALIDATION_FRACTION_CAP = 0.1


class DataError(ValueError):
    """A dataset could not be provided; the message is one line a user can act on.

    Scripts catch it and print the message instead of a traceback, so the
    message is flattened to one line and always says what to do next.
    """

    def __init__(self, message):
        super().__init__(" ".join(str(message).split()))


@dataclasses.dataclass(frozen=True, eq=False)
class Splits:
    """Train, validation and test arrays of one dataset, with what a model needs.

    Images are uint8 ``(N, H, W, C)``, labels int32 ``(N,)``. ``mean`` and
    ``std`` are per-channel statistics of the train split in pixel units
    (0..255), measured after the validation examples were removed (and after
    ``limit``), so the model's Standardize layer never sees validation or test
    data. ``eq=False`` because equality of arrays is not a boolean.
    """

    name: str
    train: tuple[np.ndarray, np.ndarray]
    validation: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]
    num_classes: int
    label_names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(H, W, C)`` of every image, the model's input shape."""
        return tuple(self.train[0].shape[1:])


def load_dataset(
    name: str,
    limit: int | None = None,
    data_dir=DATA_DIR,
    limit_test: bool = True,
    validation_size: int = 5000,
    split_seed: int = 42,
) -> Splits:
    """Load a dataset as fixed train, validation and test splits.

    Parameters
    ----------
    name : str
        ``"mnist"`` or ``"cifar10"`` read offline from ``data_dir``; a path to
        a ``.npz`` in the ``keras.datasets`` layout (`_read_npz`) or to a folder
        of images with one subfolder per class (`_read_folder`); any other
        name is loaded through tensorflow-datasets (its ``train`` and ``test``
        splits), which needs the network or a filled tfds cache.
    limit : int, optional
        Keep only the first ``limit`` examples of each split, after splitting;
        for smoke runs and tests. ``mean`` and ``std`` follow the limited train
        split.
    limit_test : bool
        Whether ``limit`` also cuts the test split. Benchmark profiles pass
        False: every accuracy they report is measured on the whole test set.
    data_dir : path-like
        Folder holding the bundled ``.npz`` files.
    validation_size : int
        Examples moved from the training set to the validation split, capped at
        10% of the training set so small datasets keep most of their data
        (MNIST and CIFAR-10 get exactly 5,000).
    split_seed : int
        Seed of the numpy permutation that draws the validation split and
        orders every split; fixed so that every run validates on the same
        examples.

    Returns
    -------
    Splits
        MNIST: 55,000 / 5,000 / 10,000 images of 28x28x1; CIFAR-10:
        45,000 / 5,000 / 10,000 images of 32x32x3.

    Raises
    ------
    DataError
        A bundled file is missing or damaged, a path names no ``.npz`` or
        image folder, or tensorflow-datasets cannot provide the dataset.
    """
    if limit is not None:
        check_positive("limit", limit)
    path = Path(name).expanduser()
    if name in BUNDLED:
        arrays = _read_bundled(name, Path(data_dir))
    elif str(name).endswith(".npz"):
        arrays = _read_npz(path)
    elif path.is_dir():
        arrays = _read_folder(path, split_seed)
    elif path.exists() or str(name).startswith(_PATH_STARTS):
        raise DataError(_not_a_dataset_file(name, path))
    else:
        arrays = _read_tfds(name)
    return _make_splits(name, *arrays, limit, validation_size, split_seed, limit_test)


# A tensorflow-datasets name may hold "/" ("mnist/3.0.1") but never starts like a
# path, so a missing or unsuitable path is named as such instead of failing in
# tfds' name parser.
_PATH_STARTS = ("/", "./", "../", "~", ".\\", "..\\")


def _not_a_dataset_file(name, path: Path) -> str:
    if path.exists():
        return f"Dataset {str(name)!r} is neither a .npz file nor a folder of images with one subfolder per class"
    return f"Dataset {str(name)!r}: no such file or folder"


def augmentation_for(dataset_name: str, channels: int | None = None) -> str:
    """The default augmentation of a dataset: ``"rotate"`` or ``"crop_flip"``.

    Digits must not be mirrored (a flipped 2 is no digit), so MNIST-like
    datasets (fashion_mnist, kmnist, emnist ...) and SVHN get small rotations;
    natural RGB images such as CIFAR-10/100 get the usual pad-4 random crop and
    horizontal flip. A user's own ``.npz`` or image folder is judged by its images:
    grayscale (``channels`` 1) rotates, colour crops and flips. ``"none"`` is
    always accepted (`augment.py`); ``--augment`` overrides the choice.
    """
    name = dataset_name.lower()
    if (name.endswith(".npz") or Path(dataset_name).expanduser().is_dir()) and channels is not None:
        return "rotate" if channels == 1 else "crop_flip"
    if "mnist" in name or name.startswith("svhn"):
        return "rotate"
    return "crop_flip"


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """Number of training steps in one epoch: ``floor(num_examples / batch_size)``.

    Training drops the last partial batch (``drop_remainder=True``) so that
    every step has the same batch shape (no retracing, constant step cost) and
    the step count needed for resuming is exact. The few examples left out
    change every epoch because the order does.
    """
    check_positive("batch_size", batch_size)
    if num_examples < batch_size:
        raise ValueError(
            f"batch_size {batch_size} exceeds the {num_examples} training "
            "examples; an epoch would have no full batch"
        )
    return num_examples // batch_size


def epoch_order(seed: int, epoch: int, num_examples: int) -> np.ndarray:
    """The training split's order in ``epoch``: a permutation that depends on (seed, epoch) alone.

    numpy's generator seeded with the pair, on the host, so both backends'
    pipelines (`pipelines.py`) walk the same order and a resumed run redraws
    epoch k exactly; one permutation costs about a millisecond per 50,000
    examples.
    """
    return np.random.default_rng([seed, epoch]).permutation(num_examples).astype(np.int32)


# === Reading the files ===


def _read_bundled(name, data_dir):
    """Raw arrays of a bundled dataset in file order, after checking the checksum.

    Returns ``(x_train, y_train, x_test, y_test, label_names)`` with images
    ``(N, H, W, C)`` uint8.
    """
    filename = _FILES[name]
    path = data_dir / filename
    if not path.is_file():
        raise DataError(
            f"{path} is missing; restore it with `git checkout -- data/{filename}` "
            "(see data/README.md)"
        )
    digest = _sha256(path)
    if digest != _SHA256[filename]:
        raise DataError(
            f"{path} is damaged (checksum mismatch: sha256 {digest[:12]}..., expected "
            f"{_SHA256[filename][:12]}...); restore it with `git checkout -- data/{filename}`"
        )
    with np.load(path) as archive:
        if name == "mnist":
            return (
                archive["x_train"][..., None],  # (N, 28, 28) -> (N, 28, 28, 1)
                archive["y_train"],
                archive["x_test"][..., None],
                archive["y_test"],
                tuple(str(digit) for digit in range(10)),
            )
        y_train, y_test = archive["y_train"], archive["y_test"]
        label_names = tuple(str(label) for label in archive["label_names"])
        cache = CACHE_DIR / f"cifar10-{digest[:16]}.npy"
        images = _read_cache(cache, (len(y_train) + len(y_test), 32, 32, 3))
        if images is None:
            images = np.concatenate(
                [
                    _decode_jpegs(archive["x_train_jpeg"], archive["x_train_offsets"]),
                    _decode_jpegs(archive["x_test_jpeg"], archive["x_test_offsets"]),
                ]
            )
            _write_cache(cache, images)
    return images[: len(y_train)], y_train, images[len(y_train) :], y_test, label_names


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _decode_jpegs(buffer, offsets):
    """Decode JPEG files stored back to back into one uint8 array ``(N, H, W, 3)``.

    Pillow (libjpeg's accurate integer DCT, the decoder data/README.md's
    channel means were measured with) rather than TensorFlow, so a JAX
    machine without TensorFlow reads the same bytes; about 20 s for CIFAR-10,
    once, then the cache serves it.
    """
    images = np.empty((len(offsets) - 1, 32, 32, 3), np.uint8)
    for i, (start, end) in enumerate(zip(offsets[:-1], offsets[1:])):
        with Image.open(io.BytesIO(buffer[start:end].tobytes())) as image:
            images[i] = np.asarray(image.convert("RGB"))
    return images


def _read_cache(path, shape):
    """The cached array, or None when it is absent, unreadable or the wrong shape."""
    try:
        images = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if images.shape != shape or images.dtype != np.uint8:
        return None
    return images


def _write_cache(path, images):
    # Write then rename, so a crash or a concurrent reader never sees half a file.
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as file:
            np.save(file, images)
        os.replace(partial, path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        warnings.warn(
            f"Could not cache decoded images at {path} ({err}); they will be decoded again"
        )


def _read_npz(path):
    """Raw arrays of a user's ``.npz`` in the ``keras.datasets`` layout, like `_read_bundled`.

    ``x_train``/``x_test``: uint8 images, (N, H, W) grayscale or (N, H, W, C)
    with C 1 or 3, of one size; ``y_train``/``y_test``: integer labels 0 to
    K-1, one per image, every class in ``y_train``; ``label_names`` optional,
    K distinct names. Anything else is a DataError naming the file and what is
    wrong.
    """
    def bad(reason):
        return DataError(f"{path}: {reason} (expected the keras.datasets layout: x_train, y_train, x_test, y_test, "
                         "optional label_names)")

    if Path(path).is_file() and not zipfile.is_zipfile(path):
        # np.load reads a .npy as one array and tells any other bytes as pickled data to load unsafely.
        raise bad("not a .npz (no zip archive: a .npy, damaged, or another format)")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise bad(f"not a readable .npz ({type(err).__name__}: {err})") from None
    with archive:
        missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in archive.files]
        if missing:
            raise bad(f"no {', '.join(missing)}")
        try:
            arrays = {k: archive[k] for k in ("x_train", "y_train", "x_test", "y_test")}
            names = archive["label_names"] if "label_names" in archive.files else None
        except ValueError:
            # Reading pickled Python objects could run code from the file, so they are refused, not loaded.
            raise bad("an array holds Python objects (dtype=object); save plain numbers and strings") from None
    for split in ("train", "test"):
        images, labels = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if images.dtype != np.uint8 or images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] not in (1, 3)):
            raise bad(f"x_{split} must hold uint8 images (N, H, W) or (N, H, W, 1 or 3), got {images.dtype} {images.shape}")
        if images.ndim == 3:
            arrays[f"x_{split}"] = images[..., None]
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or len(labels) != len(images):
            raise bad(f"y_{split} must hold one integer label per image: {labels.dtype} {labels.shape} "
                      f"for {len(images)} images")
        if len(labels) == 0 or labels.min() < 0:
            raise bad(f"y_{split} is empty or has negative labels")
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise bad(f"train images are {arrays['x_train'].shape[1:]} and test images {arrays['x_test'].shape[1:]}")
    num_classes = int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1
    # A class without training images would still get an output unit, and sparse label ids (0, 1000, 2000)
    # would build a classifier with thousands of outputs, so the classes must be 0..K-1, each in y_train.
    present = np.unique(arrays["y_train"])
    if len(present) < num_classes:
        gaps = np.flatnonzero(present != np.arange(len(present)))
        first = int(gaps[0]) if len(gaps) else len(present)
        raise bad(f"class {first} has no training image, but labels reach {num_classes - 1} "
                  f"({len(present)} classes in y_train): number the classes 0 to K-1, each in y_train")
    if names is None:
        label_names = tuple(str(c) for c in range(num_classes))
    else:
        label_names = tuple(str(n) for n in names.ravel())
        if names.ndim != 1 or len(label_names) != num_classes:
            raise bad(f"label_names must hold one name per class ({num_classes}), got shape {names.shape}")
        repeated = sorted({n for n in label_names if label_names.count(n) > 1})
        if repeated:
            raise bad(f"label_names repeat {', '.join(repeated)}: each class needs its own name")
    return arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], label_names


# The image files `keras.utils.image_dataset_from_directory` reads; other files are ignored.
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
# A folder without train/ and test/ gives this share of each class to the test split.
FOLDER_TEST_FRACTION = 0.2


def _read_folder(root, split_seed):
    """Raw arrays of a folder of images, one subfolder per class, like `_read_bundled`.

    ``root/train/<class>/*`` and ``root/test/<class>/*`` with the same class
    folders; or ``root/<class>/*``, of which `FOLDER_TEST_FRACTION` of each
    class (drawn with ``split_seed``) is the test split. Classes are the
    subfolder names in sorted order, as in
    ``keras.utils.image_dataset_from_directory``. Images are decoded by Pillow
    (no TensorFlow): all grayscale gives one channel, any colour image makes
    every image RGB; every image must have the size of the first. A corrupt
    image, an empty class folder or a size that differs is a DataError naming
    the file or folder.
    """
    def bad(where, reason):
        return DataError(f"{where}: {reason} (expected one subfolder of images per class, in train/ and test/ or "
                         "directly in the folder)")

    def classes_in(folder):
        names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not names:
            raise bad(folder, "no class subfolders")
        files = {}
        for name in names:
            files[name] = sorted(p for p in (folder / name).iterdir()
                                 if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            if not files[name]:
                raise bad(folder / name, f"an empty class folder (no {', '.join(IMAGE_EXTENSIONS)} files)")
        return files

    split_folders = [root / "train", root / "test"]
    if all(folder.is_dir() for folder in split_folders):
        train, test = (classes_in(folder) for folder in split_folders)
        if list(train) != list(test):
            raise bad(root, f"train/ has classes {list(train)} but test/ has {list(test)}")
    elif any(folder.is_dir() for folder in split_folders):
        raise bad(root, "train/ without test/ (or test/ without train/)")
    else:
        train, test = {}, {}
        rng = np.random.default_rng(split_seed)
        for name, files in classes_in(root).items():
            if len(files) < 2:
                raise bad(root / name, "one image cannot be split into train and test")
            order = rng.permutation(len(files))
            cut = max(1, round(FOLDER_TEST_FRACTION * len(files)))
            test[name], train[name] = [files[i] for i in order[:cut]], [files[i] for i in order[cut:]]
    label_names = tuple(train)
    decoded = {split: [(_decode_image(path), label) for label, name in enumerate(label_names) for path in files[name]]
               for split, files in (("train", train), ("test", test))}
    images = [image for pairs in decoded.values() for image, _ in pairs]
    first = images[0]
    for image in images:
        if image.size != first.size:
            raise bad(image.filename, f"{image.size[0]}x{image.size[1]} pixels where {first.filename} has "
                      f"{first.size[0]}x{first.size[1]}; resize the images to one size")
    colour = any(image.mode != "L" for image in images)

    def arrays(pairs):
        pixels = np.stack([np.asarray(image.convert("RGB") if colour else image, dtype=np.uint8) for image, _ in pairs])
        return (pixels if colour else pixels[..., None]), np.array([label for _, label in pairs], np.int64)

    return (*arrays(decoded["train"]), *arrays(decoded["test"]), label_names)


def _decode_image(path):
    """A Pillow image in mode "L" (grayscale) or "RGB", read whole; DataError naming the file if it is not one.

    Pillow's convert("L") clips wider pixels at 255 rather than rescaling
    them, which would turn a 16-bit PNG white wherever it passes 255. So a
    16-bit image keeps its high byte, as TensorFlow's decode_image (behind
    keras.utils.image_dataset_from_directory) does, and any other wide pixel
    (a float or 32-bit image, whatever its file name says) is refused.
    """
    try:
        with Image.open(path) as image:
            image.load()
            if _is_16_bit(image):
                converted = Image.fromarray((np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8), "L")
            elif image.mode in ("I", "F"):
                pixels = np.asarray(image)
                raise DataError(f"{path}: a {image.format} image of Pillow mode {image.mode} (pixels from "
                                f"{pixels.min():g} to {pixels.max():g}), wider than 8 bits; save the images with 8 "
                                "bits a channel or as 16-bit PNG")
            else:
                grey = image.mode in ("1", "L", "LA") or (image.mode == "P" and _grey_palette(image))
                converted = image.convert("L" if grey else "RGB")
    except DataError:
        raise
    except (OSError, UnidentifiedImageError, ValueError) as err:
        raise DataError(f"{path}: not a readable image ({type(err).__name__}: {err})") from None
    converted.filename = str(path)
    return converted


def _is_16_bit(image):
    """Pillow opens a 16-bit grayscale PNG in mode I;16 (older versions: I, 32-bit, which no other PNG uses)."""
    return image.mode.startswith("I;16") or (image.mode == "I" and image.format == "PNG")


def _grey_palette(image):
    palette = np.asarray(image.getpalette() or [], dtype=np.int64).reshape(-1, 3)
    return bool(len(palette)) and bool(np.all(palette == palette[:, :1]))


def _read_tfds(name):
    """Raw arrays of a tensorflow-datasets dataset, like `_read_bundled`."""
    offline = f"the bundled datasets {BUNDLED[0]!r} and {BUNDLED[1]!r} need no network"
    try:
        tfds = import_quietly("tensorflow_datasets")
    except ImportError:
        raise DataError(
            f"Dataset {name!r} is not bundled and tensorflow-datasets is not installed; {offline}"
        ) from None
    _check_tfds_reachable(tfds, name, offline)
    try:
        (train, test), info = tfds.load(
            name, split=["train", "test"], as_supervised=True, batch_size=-1, with_info=True
        )
        (x_train, y_train), (x_test, y_test) = tfds.as_numpy((train, test))
        label_names = tuple(info.features[info.supervised_keys[1]].names)
    # tfds fails in many ways (unknown name, no network, no test split, no
    # class names); all of them mean the same thing to the user.
    except Exception as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise DataError(
            f"Could not load dataset {name!r} through tensorflow-datasets ({reason}); {offline}"
        ) from None
    if x_train.ndim != 4 or x_train.dtype != np.uint8:
        raise DataError(
            f"Dataset {name!r} has {x_train.dtype} images of shape {x_train.shape[1:]}, "
            f"not uint8 (H, W, C) images; {offline}"
        )
    return x_train, y_train, x_test, y_test, label_names


# A host that every online machine resolves and reaches; tfds's downloads need the network.
NETWORK_PROBE = ("storage.googleapis.com", 443)
NETWORK_TIMEOUT_SECONDS = 3.0


def _check_tfds_reachable(tfds, name, offline):
    """Fail in seconds, not after tfds's minutes of download retries: an unknown name, or no local copy and no network."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # tfds warns about half-made cache folders: the error below says it all
    try:
        builder = tfds.builder(name)
        prepared = builder.is_prepared()
    except Exception as err:  # DatasetNotFoundError and its kin: the name is not a tfds dataset
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise DataError(f"Could not load dataset {name!r} through tensorflow-datasets ({reason}); {offline}") from None
    finally:
        absl.setLevel(level)
    if not prepared and not network_reachable():
        raise DataError(
            f"Dataset {name!r} is not in the tensorflow-datasets cache ({builder.data_dir}) and the network is "
            f"unreachable ({NETWORK_PROBE[0]} did not answer in {NETWORK_TIMEOUT_SECONDS:g} s); {offline}"
        )


def network_reachable():
    """Whether `NETWORK_PROBE` accepts a connection within `NETWORK_TIMEOUT_SECONDS`."""
    try:
        socket.create_connection(NETWORK_PROBE, timeout=NETWORK_TIMEOUT_SECONDS).close()
    except OSError:
        return False
    return True


# === Splitting ===


def _make_splits(
    name, x_train, y_train, x_test, y_test, label_names, limit, validation_size, split_seed, limit_test=True
):
    """Draw the validation split from the training set and assemble `Splits`.

    One numpy generator draws the training-set permutation first and the
    test-set order second, so the validation split depends on ``split_seed``
    alone, never on ``limit`` or on the test set.
    """
    if len(label_names) < 2:
        raise DataError(f"{name}: one class ({', '.join(label_names)}): a classifier needs at least two")
    rng = np.random.default_rng(split_seed)
    order = rng.permutation(len(y_train))
    test_order = rng.permutation(len(y_test))
    num_validation = min(validation_size, int(_VALIDATION_FRACTION_CAP * len(y_train)))
    validation_index, train_index = order[:num_validation], order[num_validation:]
    # Limit the indices before gathering, so a smoke run never copies a full
    # split; `[:None]` keeps everything.
    train, validation, test = (
        (images[index[:cut]], labels[index[:cut]].astype(np.int32))
        for images, labels, index, cut in (
            (x_train, y_train, train_index, limit),
            (x_train, y_train, validation_index, limit),
            (x_test, y_test, test_order, limit if limit_test else None),
        )
    )
    mean, std = _channel_stats(train[0])
    return Splits(
        name=name,
        train=train,
        validation=validation,
        test=test,
        num_classes=len(label_names),
        label_names=label_names,
        mean=mean,
        std=std,
    )


def _channel_stats(images):
    """Exact per-channel mean and std of uint8 images, in pixel units.

    From per-channel histograms: exact, and chunked so each block stays in
    cache (a quarter of a second for CIFAR-10 where float sums take seconds).
    A channel constant over the images (an alpha channel that is always 255,
    say) gets std 1, so it is standardised to 0 rather than divided by 0, as
    scikit-learn's StandardScaler does.
    """
    pixels = images.reshape(-1, images.shape[-1])  # (N*H*W, C)
    counts = np.zeros((pixels.shape[1], 256), np.int64)
    for start in range(0, len(pixels), 1 << 20):
        block = pixels[start : start + (1 << 20)]
        for channel in range(pixels.shape[1]):
            counts[channel] += np.bincount(block[:, channel], minlength=256)
    values = np.arange(256, dtype=np.float64)
    total = counts.sum(axis=1)
    mean = counts @ values / total
    std = np.sqrt(np.maximum(counts @ values**2 / total - mean**2, 0.0))
    std[std == 0] = 1.0
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)
