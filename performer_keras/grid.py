"""Patch-grid coordinates shared by the position encodings."""

import numpy as np


def grid_positions(grid_size):
    """(H*W, 2) float32 array of (row, column) for patches in row-major order."""
    rows, cols = np.meshgrid(np.arange(grid_size[0]), np.arange(grid_size[1]), indexing="ij")
    return np.stack([rows.ravel(), cols.ravel()], axis=-1).astype("float32")
