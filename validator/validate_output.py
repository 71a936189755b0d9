"""`ghpsim validate`'s result files, and what a validation cut short by a failed rank keeps.

The results (`write_results`: the CSV, the plot, the traces and with --step-spans the steps of
every launch) are written through a staging folder (`validator.report.staged_folder`): --out gets
every file or none. A validation whose later strategy fails (a rank killed, crashed or hung:
`RankFailure`) writes the results of the strategies measured before it (`kept_after_failure`),
complete and consistent, and says where in its one error line; where none had been measured, it
writes nothing. An interrupted one (Ctrl-C) keeps them the same way (`kept_after_interrupt`); a
stop that comes while the results are being written waits until they are (`stop_signals_held`). An
earlier validation's traces in the same --out are replaced, not left beside the new ones.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

import pandas as pd

from simulator.errors import MAX_MESSAGE_CHARS, one_line
from validator.errors import RankFailure
from validator.report import error_summary, staged_folder, write_plot, write_rows_csv, write_step_spans, write_traces


VALIDATE_OWN_FILES = ("traces/*.measured.trace.json", "traces/*.simulated.trace.json", "traces/*.steps.csv")
"""What an earlier validation into the same --out wrote in traces/: replaced by this one's, so no
timeline of a strategy it did not run stays beside its results (other files there are kept)."""

HELD_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@contextlib.contextmanager
def stop_signals_held():
    """Ctrl-C, SIGTERM and SIGHUP held while the results are written, then passed to the handlers
    that were in place: a stop that comes mid-write ends the command once every file is in place,
    not with the measurements lost. Only signals with a Python handler are held (`ghpsim.cli`
    installs one for each; an ignored or default one is left alone). Python runs handlers in the
    main thread, so elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = [getattr(signal, name) for name in HELD_SIGNALS if hasattr(signal, name)]
    handlers = {number: signal.getsignal(number) for number in numbers}
    handlers = {number: handler for number, handler in handlers.items() if callable(handler)}
    caught: list[int] = []
    for number in handlers:
        signal.signal(number, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    if caught:
        handlers[caught[0]](caught[0], None)


class Kept:
    """What a validation's finished launches measured, per strategy label in the order first run:
    `case` is `validator.validate.validate`'s `on_case`, `step_spans` its `on_step_spans`."""

    def __init__(self) -> None:
        self.cases: dict[str, tuple] = {}  # label: (row, measured spans, predicted SimulationResult)
        self.step_spans: dict[str, object] = {}  # label: every measured step of its launches so far

    def case(self, row: dict, spans: list, predicted) -> None:
        self.cases[row["strategy"]] = (row, spans, predicted)

    def rows(self) -> list[dict]:
        return [row for row, _spans, _predicted in self.cases.values()]


def write_results(kept: Kept, out: str | Path, stem: str) -> dict:
    """Write `kept`'s strategies into the folder `out` at once (`staged_folder`): `<stem>.csv`,
    `<stem>.png`, traces/ (measured and simulated timelines, and the steps with --step-spans).
    Returns the paths as `--json` gives them: {"csv", "plot", "traces" (the folder), "files"
    (every file written)}."""
    out = Path(out)
    rows = kept.rows()
    summary = error_summary(rows)
    with stop_signals_held(), staged_folder(out, superseded=VALIDATE_OWN_FILES) as staging:
        write_rows_csv(rows, staging / f"{stem}.csv")
        for label, (_row, spans, predicted) in kept.cases.items():
            write_traces(label, spans, predicted.spans, staging / "traces")
        for label, table in kept.step_spans.items():
            if label in kept.cases:
                write_step_spans(label, table, staging / "traces")
        write_plot(pd.DataFrame(rows), staging / f"{stem}.png",
                   f"{stem}: predicted vs measured, MAPE {summary['mape_pct']:.1f} %")
        files = sorted(str(out / path.relative_to(staging)) for path in staging.rglob("*") if path.is_file())
    return {"csv": str(out / f"{stem}.csv"), "plot": str(out / f"{stem}.png"), "traces": str(out / "traces"),
            "files": files}


def kept_after_interrupt(kept: Kept, out: str | Path, stem: str, repeats: int = 1) -> str:
    """The line for a validation interrupted (Ctrl-C) once some strategies were measured: as
    `kept_after_failure` says it for a failed rank, `interrupted; the 1 finished strategy [dp
    (G=2 x M=1)] is in out/mlp_cpu.csv`, once they are written."""
    return str(kept_after_failure(RankFailure("interrupted"), kept, out, stem, repeats))


def kept_after_failure(failure: RankFailure, kept: Kept, out: str | Path, stem: str, repeats: int = 1) -> RankFailure:
    """The error to raise for a validation cut short by `failure`: its own line where no strategy
    had been measured (nothing written); else, once the measured strategies' results are written
    (`write_results`), the line with where they are: `...; the 1 finished strategy [dp (G=2 x M=1)]
    is in out/mlp_cpu.csv` (the failure's own text shortened first where the line would pass
    MAX_MESSAGE_CHARS). With --repeats, a strategy measured in fewer rounds than asked is kept
    too (the CSV's launches column says in how many)."""
    if not kept.cases:
        return failure
    try:
        csv = write_results(kept, out, stem)["csv"]
    except OSError as error:
        return RankFailure(f"{failure}; the strategies measured before it could not be written to {out}: "
                           f"{error.strerror or error}")
    rows = kept.rows()
    count, short = len(rows), any(row.get("launches", repeats) < repeats for row in rows)
    what = ("finished " if not short else "") + ("strategy" if count == 1 else "strategies")
    verb = "is" if count == 1 else "are"
    rounds = f" (some in fewer than the --repeats {repeats} rounds: the CSV's launches column)" if short else ""
    message = f"{failure}; the {count} {what} [{', '.join(row['strategy'] for row in rows)}] {verb} in {csv}{rounds}"
    if len(message) > MAX_MESSAGE_CHARS:  # the file in full rather than every label or all of the failure
        tail = f"; the {count} {what} {verb} in {csv}{rounds}"
        message = one_line(str(failure), max(40, MAX_MESSAGE_CHARS - len(tail))) + tail
    return RankFailure(message)
