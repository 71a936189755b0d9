"""Layer timing on a CUDA stream, for `validator.microbench._time_blocks`.

On a GPU a host clock around a synchronised call times launch + run + synchronise, while in a
training step the host enqueues layer after layer and the GPU runs them back to back. So on CUDA a
timed iteration records events on the stream and returns a reader, and a block of iterations is
read only after all of it was enqueued (measured on an H200: timing layers synchronised
over-predicted every 2-rank case, by 27 % on average; reports/ACCURACY.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def settled(parts) -> tuple[float, ...]:
    """The parts of a timed iteration: `parts` itself, or what its reader returns."""
    return parts() if callable(parts) else parts


def stream_timed(forward: Callable[[], None], backward: Callable[[], None]) -> Callable[[], tuple[float, float]]:
    """Enqueue `forward` then `backward` on the current CUDA stream between events, with no
    synchronisation; returns the reader of their (forward_s, backward_s): the stream time between
    the events (the kernels, or the host's launch time where that is longer). CUDA events:
    torch.cuda.Event(enable_timing=True); elapsed_time is in ms."""
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    marks[0].record()
    forward()
    marks[1].record()
    backward()
    marks[2].record()

    def read() -> tuple[float, float]:
        marks[2].synchronize()
        return marks[0].elapsed_time(marks[1]) / 1e3, marks[1].elapsed_time(marks[2]) / 1e3

    return read
