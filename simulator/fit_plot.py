"""Predicted against measured step time (matplotlib, Agg, imported only when a figure is drawn):
`ghpsim fit --plot` draws each run's held-out prediction against its measured step time, on log
axes with the diagonal and a +-10 % band, so a user sees which runs the fitted model misses and by
how much before trusting its profile. The published-accuracy benchmarks draw on the same axes."""

from __future__ import annotations

from pathlib import Path

from simulator.output import write_figure_atomic

BAND = 0.10
"""The band drawn around the diagonal: +-10 %."""


def predicted_against_measured(axis, low: float, high: float, unit: str, title: str) -> None:
    """y = x (solid) and +-10 % (dashed) over [low, high] on log axes labelled in `unit`."""
    for factor, style in ((1.0, "-"), (1 - BAND, "--"), (1 + BAND, "--")):
        axis.plot([low, high], [factor * low, factor * high], style, color="black", linewidth=0.7)
    axis.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel=f"measured ({unit})",
             ylabel=f"predicted ({unit})", title=title)
    axis.title.set_fontsize(9)
    if high / low < 30:  # under 1.5 decades matplotlib labels every minor tick and they collide: plain 2s and 5s
        from matplotlib.ticker import FormatStrFormatter, LogLocator, NullLocator
        for scale in (axis.xaxis, axis.yaxis):
            scale.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            scale.set_major_formatter(FormatStrFormatter("%g"))
            scale.set_minor_locator(NullLocator())


def write_fit_plot(measured_s: list[float], held_out_s: list[float], path: str | Path, title: str) -> Path:
    """Scatter of held-out predicted against measured step time (ms), written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    measured_ms = [1e3 * value for value in measured_s]
    predicted_ms = [1e3 * value for value in held_out_s]
    figure, axis = plt.subplots(figsize=(5.5, 5))
    try:
        predicted_against_measured(axis, min(measured_ms + predicted_ms) / 1.3, max(measured_ms + predicted_ms) * 1.3,
                                   "ms", title)
        axis.set_ylabel("predicted, held out (ms)")
        inside = [abs(p - m) <= BAND * m for p, m in zip(predicted_ms, measured_ms)]
        for within, colour, name in ((True, "tab:blue", "within 10 %"), (False, "tab:red", "beyond 10 %")):
            xs = [m for m, keep in zip(measured_ms, inside) if keep == within]
            ys = [p for p, keep in zip(predicted_ms, inside) if keep == within]
            if xs:
                axis.scatter(xs, ys, s=14, color=colour, label=f"{name} ({len(xs)})")
        axis.legend(fontsize=8, loc="upper left")
        figure.tight_layout()
        return write_figure_atomic(path, figure, dpi=120)
    finally:
        plt.close(figure)
