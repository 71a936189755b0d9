"""What the published-accuracy benchmarks' `--plot` figures share: log-log axes of predicted against
measured with y = x and the +-10 % band, and an atomic write of the figure (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported only when a figure is asked for)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def predicted_against_measured(axis, low: float, high: float, unit: str, title: str) -> None:
    """y = x (solid) and +-10 % (dashed) over [low, high] on log axes labelled in `unit`."""
    for factor, style in ((1.0, "-"), (0.9, "--"), (1.1, "--")):
        axis.plot([low, high], [factor * low, factor * high], style, color="black", linewidth=0.7)
    axis.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel=f"measured ({unit})",
             ylabel=f"predicted ({unit})", title=title)
    axis.title.set_fontsize(9)


def save(figure, path: Path, title: str, dpi: int = 110) -> Path:
    """Title, lay out and write `figure` atomically (temp file + rename), then close it."""
    from simulator.output import write_figure_atomic
    figure.suptitle(f"{title} (dashed: +-10 %)", fontsize=9)
    figure.tight_layout()
    try:
        return write_figure_atomic(path, figure, dpi=dpi)
    finally:
        pyplot().close(figure)
