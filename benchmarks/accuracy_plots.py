"""What the published-accuracy benchmarks' `--plot` figures share besides their axes (those are
`simulator.fit_plot.predicted_against_measured`, which `ghpsim fit --plot` draws on too): pyplot on
the Agg backend and an atomic write of the figure."""

from __future__ import annotations

from pathlib import Path


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
