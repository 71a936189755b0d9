"""`ghpsim fit --plot`: each run's held-out prediction against its measured step time (matplotlib,
Agg), on log axes with the diagonal and a +-10 % band, so a user sees which runs the fitted
model misses and by how much before trusting its profile."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.output import write_figure_atomic  # noqa: E402

BAND = 0.10
"""The band drawn around the diagonal: +-10 %."""


def write_fit_plot(measured_s: list[float], held_out_s: list[float], path: str | Path, title: str) -> Path:
    """Scatter of held-out predicted against measured step time (ms), written atomically."""
    measured_ms = [1e3 * value for value in measured_s]
    predicted_ms = [1e3 * value for value in held_out_s]
    low = min(measured_ms + predicted_ms) / 1.3
    high = max(measured_ms + predicted_ms) * 1.3
    figure, axis = plt.subplots(figsize=(5.5, 5))
    try:
        line = [low, high]
        axis.plot(line, line, color="black", linewidth=0.8, label="predicted = measured")
        for factor in (1 - BAND, 1 + BAND):
            axis.plot(line, [factor * x for x in line], color="grey", linewidth=0.6, linestyle="--")
        inside = [abs(p - m) <= BAND * m for p, m in zip(predicted_ms, measured_ms)]
        for within, colour, name in ((True, "tab:blue", "within 10 %"), (False, "tab:red", "beyond 10 %")):
            xs = [m for m, keep in zip(measured_ms, inside) if keep == within]
            ys = [p for p, keep in zip(predicted_ms, inside) if keep == within]
            if xs:
                axis.scatter(xs, ys, s=14, color=colour, label=f"{name} ({len(xs)})")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlim(low, high)
        axis.set_ylim(low, high)
        axis.set_xlabel("measured step time (ms)")
        axis.set_ylabel("predicted step time, held out (ms)")
        axis.legend(fontsize=8, loc="upper left")
        axis.set_title(title, fontsize=9)
        figure.tight_layout()
        return write_figure_atomic(path, figure, dpi=120)
    finally:
        plt.close(figure)
