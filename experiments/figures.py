"""What every figure shares: the colour of each kernel and the marker of each position, taken
from the registry's tables, and an off-screen canvas (matplotlib's object API, never pyplot)."""

import numpy as np

from experiments import atomic
from performer_keras.registry import KERNEL_TABLE, POSITION_TABLE, POSITIONS

UNKNOWN_COLOUR, UNKNOWN_MARKER = "black", "x"
# A confusion matrix prints its counts in the cells up to this many classes.
_ANNOTATED_CLASSES = 20


def new_figure(width, height):
    """A matplotlib Figure of `width` x `height` inches on the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def kernel_colour(kernel):
    """The kernel's colour (`registry.Kernel.colour`) in every figure."""
    return KERNEL_TABLE[kernel].colour if kernel in KERNEL_TABLE else UNKNOWN_COLOUR


def position_marker(position):
    """The position's marker (`registry.Position.marker`) in every figure."""
    return POSITION_TABLE[position].marker if position in POSITION_TABLE else UNKNOWN_MARKER


def position_colour(position):
    """A colour per position, for figures whose panels already separate the kernels."""
    return f"C{list(POSITIONS).index(position)}" if position in POSITION_TABLE else UNKNOWN_COLOUR


def plot_confusion_matrix(confusion, class_names, path, title=""):
    """Save the confusion matrix as a PNG: rows true, columns predicted.

    Colour is the fraction of each true class (so rare and common classes
    read alike), annotated with counts up to `_ANNOTATED_CLASSES` classes.
    Uses matplotlib's object API with the Agg canvas, never pyplot, so the
    caller's matplotlib backend is left alone.
    """
    counts = np.asarray(confusion)
    rates = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    num_classes = len(counts)
    size = max(4.0, 0.45 * num_classes + 2.0)
    figure = new_figure(size + 1.0, size)
    axes = figure.add_subplot()
    image = axes.imshow(rates, cmap="Blues", vmin=0.0, vmax=1.0)
    axes.set(
        xticks=range(num_classes), yticks=range(num_classes),
        xticklabels=class_names, yticklabels=class_names,
        xlabel="predicted class", ylabel="true class", title=title,
    )
    axes.tick_params(axis="x", labelrotation=90 if num_classes > 10 else 0)
    if num_classes <= _ANNOTATED_CLASSES:
        for (row, column), count in np.ndenumerate(counts):
            colour = "white" if rates[row, column] > 0.5 else "black"
            axes.text(column, row, str(count), ha="center", va="center", color=colour, fontsize=8)
    figure.colorbar(image, ax=axes, label="fraction of the true class")
    figure.tight_layout()
    atomic.save_figure(figure, path, dpi=100)
