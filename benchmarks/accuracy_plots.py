"""What the published-accuracy benchmarks' `--plot` figures share besides their axes (those are
`simulator.fit_plot.predicted_against_measured`, which `ghpsim fit --plot` draws on too): pyplot on
the Agg backend and an atomic write of the figure; their `--processes`, `--json` and `--plot` options;
and the convergence benchmarks' loss legend."""

from __future__ import annotations

import os
from pathlib import Path


def add_report_options(parser) -> None:
    """The options a published-accuracy benchmark shares: worker processes, JSON output, the figure file."""
    parser.add_argument("--processes", type=int, default=os.cpu_count(), help="worker processes")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                        help="draw predicted against measured for every run into this figure")


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported only when a figure is asked for)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(figure, path: Path, title: str, dpi: int = 110) -> Path:
    """Title, lay out and write `figure` atomically (temp file + rename), then close it."""
    from simulator.output import write_figure_atomic
    figure.suptitle(f"{title} (dashed: +-10 %)", fontsize=9)
    figure.tight_layout()
    try:
        return write_figure_atomic(path, figure, dpi=dpi)
    finally:
        pyplot().close(figure)


def loss_legend(axis) -> None:
    """The legend of a convergence plot: one entry per run (its colour), then what the two line
    styles mean (held-out loss: markers; training loss, 10-step mean: faint), so the y label stays short."""
    from matplotlib.lines import Line2D
    handles, labels = axis.get_legend_handles_labels()
    handles += [Line2D([], [], color="grey", marker="o", markersize=3), Line2D([], [], color="grey", alpha=0.35)]
    labels += ["held-out loss", "training loss, 10-step mean"]
    axis.set_ylabel("loss")
    axis.legend(handles, labels, fontsize=8)
