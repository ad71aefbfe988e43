"""The keras.ops augmentation against numpy references, on whichever backend runs the tests."""

import numpy as np
import pytest
from keras import ops

from experiments import augment

# lowbias32 in plain Python integers: the reference for the keras.ops hash on every backend.
def _reference_hash(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) % 2**32
    x ^= x >> 15
    x = (x * 0x846CA68B) % 2**32
    return x ^ (x >> 16)


def _reference_uniforms(seed, epoch, index):
    key = _reference_hash(_reference_hash(seed % 2**32) ^ epoch)
    example = _reference_hash(key ^ _reference_hash(index))
    return [(_reference_hash(example ^ (d * 0x9E3779B9) % 2**32) >> 8) / 2**24 for d in range(augment.DRAWS)]


def test_draws_are_the_reference_hash_of_seed_epoch_and_example():
    index = np.array([0, 1, 7, 54_999, 2**31 - 1])
    draws = ops.convert_to_numpy(augment.uniforms(12345, 3, index))
    expected = [_reference_uniforms(12345, 3, int(i)) for i in index]
    np.testing.assert_array_equal(draws, np.array(expected, np.float32))


def test_draws_look_uniform_and_independent():
    draws = ops.convert_to_numpy(augment.uniforms(0, 0, np.arange(20_000)))
    assert draws.min() >= 0.0 and draws.max() < 1.0
    np.testing.assert_allclose(draws.mean(axis=0), 0.5, atol=0.01)
    np.testing.assert_allclose(np.corrcoef(draws.T), np.eye(augment.DRAWS), atol=0.03)
    other_epoch = ops.convert_to_numpy(augment.uniforms(0, 1, np.arange(20_000)))
    assert abs(np.corrcoef(draws[:, 0], other_epoch[:, 0])[0, 1]) < 0.03


def test_crop_flip_is_the_padded_crop():
    images = np.arange(2 * 6 * 5 * 2, dtype=np.float32).reshape(2, 6, 5, 2)
    cases = [(0, 0, False), (1, -2, True), (-4, 4, False), (4, -4, True)]
    for shift_y, shift_x, flip in cases:
        result = ops.convert_to_numpy(augment.crop_flip(
            images, np.full(2, shift_y, np.float32), np.full(2, shift_x, np.float32), np.full(2, flip)))
        for b in range(2):
            padded = np.pad(images[b], ((4, 4), (4, 4), (0, 0)))
            crop = padded[4 + shift_y : 4 + shift_y + 6, 4 + shift_x : 4 + shift_x + 5]
            np.testing.assert_array_equal(result[b], crop[:, ::-1] if flip else crop)


def _reference_rotation(image, angle, shift_y=0, shift_x=0):
    """Brute-force bilinear rotation of one (H, W, C) image about its centre, then a shift, zeros outside."""
    height, width, _ = image.shape
    cy, cx = (height - 1) / 2, (width - 1) / 2
    out = np.zeros_like(image)
    for y in range(height):
        for x in range(width):
            sx = np.cos(angle) * (x - cx) - np.sin(angle) * (y - cy) + cx + shift_x
            sy = np.sin(angle) * (x - cx) + np.cos(angle) * (y - cy) + cy + shift_y
            y0, x0 = int(np.floor(sy)), int(np.floor(sx))
            for yy, wy in ((y0, 1 - (sy - y0)), (y0 + 1, sy - y0)):
                for xx, wx in ((x0, 1 - (sx - x0)), (x0 + 1, sx - x0)):
                    if 0 <= yy < height and 0 <= xx < width:
                        out[y, x] += wy * wx * image[yy, xx]
    return out


def test_rotation_matches_the_brute_force_reference_and_keeps_the_centre():
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (3, 5, 7, 1)).astype(np.float32)  # odd sizes: the centre is a pixel
    angles = np.array([0.0, np.deg2rad(9.0), -np.deg2rad(10.0)], np.float32)
    turned = ops.convert_to_numpy(augment.rotate(images, angles))
    for b in range(3):
        np.testing.assert_allclose(turned[b], _reference_rotation(images[b], float(angles[b])), atol=1e-3)
    np.testing.assert_allclose(turned[:, 2, 3], images[:, 2, 3], atol=1e-3)
    np.testing.assert_allclose(turned[0], images[0], atol=1e-4)
    quarter = ops.convert_to_numpy(augment.rotate(images[:1, :, :5], np.array([np.pi / 2], np.float32)))
    np.testing.assert_allclose(quarter[0, ..., 0], np.rot90(images[0, :, :5, 0]), atol=1e-3)


def test_rotate_shift_matches_the_brute_force_reference_and_a_plain_shift_is_the_crop():
    rng = np.random.default_rng(2)
    images = rng.uniform(0, 255, (3, 5, 7, 1)).astype(np.float32)
    angles = np.array([np.deg2rad(7.0), -np.deg2rad(10.0), 0.0], np.float32)
    shift_y, shift_x = np.array([3.0, -2.0, 1.0], np.float32), np.array([-3.0, 0.0, 2.0], np.float32)
    moved = ops.convert_to_numpy(augment.rotate(images, angles, shift_y, shift_x))
    for b in range(3):
        reference = _reference_rotation(images[b], float(angles[b]), float(shift_y[b]), float(shift_x[b]))
        np.testing.assert_allclose(moved[b], reference, atol=1e-3)
    cropped = augment.crop_flip(images[2:], shift_y[2:], shift_x[2:], np.zeros(1, bool))
    np.testing.assert_allclose(moved[2], ops.convert_to_numpy(cropped)[0], atol=1e-4)


def test_rotate_shift_draws_the_rotation_of_rotate_and_shifts_uniform_in_three_pixels():
    index = np.arange(7000)
    rotate = augment.draw("rotate", 5, 1, index)
    rotate_shift = {k: ops.convert_to_numpy(v) for k, v in augment.draw("rotate_shift", 5, 1, index).items()}
    # The same angle as rotate's: adding the shift leaves the rotation draw alone.
    np.testing.assert_array_equal(ops.convert_to_numpy(rotate["angle"]), rotate_shift["angle"])
    for name in ("shift_y", "shift_x"):
        shifts = rotate_shift[name]
        assert set(np.unique(shifts).tolist()) == set(range(-3, 4))
        assert np.bincount((shifts + 3).astype(int), minlength=7).min() > 7000 / 7 * 0.85
    assert abs(np.corrcoef(rotate_shift["shift_y"], rotate_shift["shift_x"])[0, 1]) < 0.05
    assert abs(np.corrcoef(rotate_shift["shift_y"], rotate_shift["angle"])[0, 1]) < 0.05


@pytest.mark.parametrize("kind", ["rotate", "crop_flip"])
def test_augment_draws_the_documented_distributions(kind):
    index = np.arange(4000)
    images = np.zeros((4000, 9, 9, 1), np.uint8)
    images[:, 4, 4] = 255  # one bright centre pixel: its new place shows the draw
    result = ops.convert_to_numpy(augment.augment(images, index, 2, 7, kind))
    assert result.shape == images.shape and result.dtype == np.float32
    assert result.min() >= 0.0 and result.max() <= 255.0
    if kind == "rotate":  # a rotation about the centre never moves the centre pixel
        np.testing.assert_allclose(result[:, 4, 4, 0], 255.0, atol=1e-3)
        return
    # Shifts of at most 4 keep the pixel inside; it lands at row 4 - shift_y, and at
    # column 4 - shift_x (or 4 + shift_x when flipped): each of the 9 places about equally often.
    moved = result[..., 0].reshape(4000, 81).argmax(axis=1)
    assert (result.reshape(4000, -1) == 255).sum(axis=1).tolist() == [1] * 4000
    for place in (moved // 9, moved % 9):
        assert np.bincount(place, minlength=9).min() > 4000 / 9 * 0.8


def test_augment_is_a_pure_function_of_seed_epoch_and_example():
    images = np.random.default_rng(1).integers(0, 256, (16, 8, 8, 3), dtype=np.uint8)
    index = np.arange(100, 116)
    first = ops.convert_to_numpy(augment.augment(images, index, 4, 9, "crop_flip"))
    np.testing.assert_array_equal(first, ops.convert_to_numpy(augment.augment(images, index, 4, 9, "crop_flip")))
    # The same example keeps its draw wherever it sits in the batch.
    reordered = ops.convert_to_numpy(augment.augment(images[::-1], index[::-1], 4, 9, "crop_flip"))
    np.testing.assert_array_equal(first, reordered[::-1])
    assert not np.array_equal(first, ops.convert_to_numpy(augment.augment(images, index, 5, 9, "crop_flip")))
    np.testing.assert_array_equal(ops.convert_to_numpy(augment.augment(images, index, 4, 9, "none")), images)
    with pytest.raises(ValueError, match="Unknown augmentation 'mixup'"):
        augment.augment(images, index, 0, 0, "mixup")
