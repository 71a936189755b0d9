"""The least-squares line the calibration fits to its medians (`validator.calibrate`): compute
times against batch size or parameter count, communication times against message size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class LineFit(NamedTuple):
    intercept: float
    slope: float
    r2: float
    clamped: str | None
    """None, or what was clamped and why (a negative intercept or a negative slope)."""


def fit_line(xs: Sequence[float], ys: Sequence[float], weights: Sequence[float] | None = None) -> LineFit:
    """Least squares `y = intercept + slope * x` (numpy), optionally weighted, never negative.

    A negative intercept is clamped to 0 and the slope refitted through the origin; a negative
    slope (the time does not measurably grow with x) is clamped to 0 and the intercept refitted
    as the (weighted) mean. `clamped` says which happened. R^2 is of the final line, unweighted.
    """
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) == 0:
        raise ValueError(f"fit_line: need two equally long, non-empty 1-D sequences (got {x.shape}, {y.shape})")
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float)
    sw = np.sqrt(w)
    clamped = None
    if len(np.unique(x)) < 2:
        intercept, slope = float(np.average(y, weights=w)), 0.0
        clamped = "one distinct x: slope set to 0"
    else:
        design = np.stack([np.ones_like(x), x], axis=1)
        (intercept, slope), *_ = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)
        intercept, slope = float(intercept), float(slope)
        if intercept < 0:
            slope = float(np.sum(w * x * y) / np.sum(w * x * x))
            clamped = f"negative intercept {intercept:.3g} clamped to 0, slope refitted through the origin"
            intercept = 0.0
        if slope < 0:
            clamped = f"negative slope {slope:.3g} clamped to 0, intercept refitted as the mean"
            intercept, slope = float(np.average(y, weights=w)), 0.0
    predicted = intercept + slope * x
    total = float(np.sum((y - y.mean()) ** 2))
    residual = float(np.sum((y - predicted) ** 2))
    r2 = 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else 0.0)
    return LineFit(intercept, slope, r2, clamped)
