"""The benchmark report's figures: accuracy against latency with its Pareto front, and validation curves.

Every colour and marker comes from `figures` (the registry's tables), so a
variant looks the same in every figure of the project.
"""

import math

import numpy as np

from experiments import atomic
from experiments.figures import kernel_colour, new_figure, position_colour, position_marker

DATASET_NAMES = {"mnist": "MNIST", "cifar10": "CIFAR-10"}


def dataset_name(dataset):
    """"cifar10" -> "CIFAR-10"; an unknown name as it is."""
    return DATASET_NAMES.get(dataset, dataset)


def _style(variant):
    kernel, _, position = variant.partition("-")
    return kernel_colour(kernel), position_marker(position)


def pareto_front(points):
    """Indices of the points (latency, accuracy) no other point beats on both (lower latency, higher accuracy)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def plot_pareto(timed, dataset, path):
    """Test accuracy (mean, std bars) against batch-1 latency per image, front joined.

    Args:
        timed: [(cell, latency in ms)] of finished cells, every latency from one device and XLA setting.
    """
    if not timed:
        return False
    figure = new_figure(7.5, 5)
    axes = figure.add_subplot()
    done = [c for c, _ in timed]
    points = [(latency, c["test_accuracy"]["mean"]) for c, latency in timed]
    for c, (x, y) in zip(done, points):
        colour, marker = _style(c["variant"])
        axes.errorbar(x, 100 * y, yerr=100 * (c["test_accuracy"]["std"] or 0), fmt=marker, color=colour, capsize=3)
        axes.annotate(c["label"], (x, 100 * y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    front = pareto_front(points)
    axes.step([points[i][0] for i in front], [100 * points[i][1] for i in front], where="post",
              color="grey", linestyle="--", marker="o", markerfacecolor="none", markersize=12, label="Pareto front")
    latencies = [x for x, _ in points]
    log_scale = max(latencies) / min(latencies) > 5
    if log_scale:
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        axes.set_xscale("log")
        axes.xaxis.set_major_formatter(ScalarFormatter())
        axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set(xlabel=f"inference latency, ms per image (batch 1{', log scale' if log_scale else ''})",
             ylabel="test accuracy %", title=f"{dataset_name(dataset)}: accuracy against latency (mean ± std over seeds)")
    axes.legend(loc="lower right")
    figure.tight_layout()
    atomic.save_figure(figure, path, dpi=110)
    return True


def plot_curves(cells, dataset, path):
    """Validation accuracy per epoch, one panel per kernel, mean line and ±std band per position."""
    from matplotlib.ticker import MaxNLocator

    with_curves = [c for c in cells if c["val_accuracy_curve"]["epochs"]]
    kernels = list(dict.fromkeys(c["variant"].partition("-")[0] for c in with_curves))
    if not kernels:
        return False
    columns = min(3, len(kernels))
    rows = math.ceil(len(kernels) / columns)
    figure = new_figure(4.5 * columns, 3.6 * rows + 0.4)
    first = None
    for index, kernel in enumerate(kernels, 1):
        axes = figure.add_subplot(rows, columns, index, sharey=first)
        first = first or axes
        for c in (c for c in with_curves if c["variant"].startswith(kernel + "-")):
            curve = c["val_accuracy_curve"]
            position = c["variant"].partition("-")[2]
            mean, std = 100 * np.array(curve["mean"]), 100 * np.array(curve["std"])
            colour = position_colour(position)
            axes.plot(curve["epochs"], mean, marker=position_marker(position), color=colour, markersize=4,
                      label=f"{c['label']} ({len(c['seeds']['finished'])} seeds)")
            axes.fill_between(curve["epochs"], mean - std, mean + std, color=colour, alpha=0.2)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set(title=kernel, xlabel="epoch", ylabel="validation accuracy %")
        axes.legend(fontsize=7, loc="lower right")
    figure.suptitle(f"{dataset_name(dataset)}: validation accuracy, mean and ±std band over seeds")
    figure.tight_layout()
    atomic.save_figure(figure, path, dpi=110)
    return True
