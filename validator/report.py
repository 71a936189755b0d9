"""Validation outputs: the predicted-vs-measured table (CSV), its summary figures, its plot (PNG)
and the traces.

Each file is written atomically. `ghpsim validate` writes them once every case has run (or a
rank failed or the run was interrupted: the strategies measured before, `validator.validate_output`),
into a staging folder beside --out whose files then move into --out (`staged_folder`): --out gets
every file or none, and a validation interrupted before any strategy finished leaves it as it was. A staging folder left by a process killed
outright (SIGKILL) is removed by the next run that writes the same --out (`remove_stale_staging`).
"""

from __future__ import annotations

import io
import math
import os
import re
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from simulator.errors import ScenarioError
from simulator.output import write_json_atomic, write_text_atomic
from simulator.records import span_table
from simulator.trace import trace_events

MAPE_TARGET_PCT = 10.0
WORST_TARGET_PCT = 20.0


def json_ready(value):
    """`value` with every non-finite float (NaN: a figure not measured, such as the launch noise of
    a single launch) replaced by None, so `json.dumps(..., allow_nan=False)` writes strict JSON
    (null) where Python would write NaN; nested dicts, lists and tuples are walked."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def write_rows_csv(rows: list[dict], path: Path) -> Path:
    return write_text_atomic(path, pd.DataFrame(rows).to_csv(index=False))


def error_summary(rows: list[dict]) -> dict:
    """The figures of a validation's rows (`validator.validate`): the number of cases, the mean
    absolute percentage error, the worst |error| and the mean signed error, in percent."""
    errors = [row["error_pct"] for row in rows]
    return {"cases": len(errors), "mape_pct": sum(map(abs, errors)) / len(errors),
            "worst_pct": max(map(abs, errors)), "mean_signed_pct": sum(errors) / len(errors)}


def summary_line(summary: dict) -> str:
    """`error_summary` in one line, against the targets (MAPE <= 10 %, worst <= 20 %)."""
    return (f"cases {summary['cases']} | MAPE {summary['mape_pct']:.1f} % (target <= {MAPE_TARGET_PCT:.0f}) | "
            f"worst {summary['worst_pct']:.1f} % (target <= {WORST_TARGET_PCT:.0f}) | "
            f"mean signed {summary['mean_signed_pct']:+.1f} %")


def case_line(row: dict) -> str:
    """One case: predicted, measured and the error (and the launches' spread where there were several)."""
    spread = f"  (launches spread {row['launch_spread_pct']:.0f} %)" if row.get("launches", 1) > 1 else ""
    return (f"{row['strategy']:>22s}  predicted {row['predicted_s'] * 1e3:9.2f} ms  measured "
            f"{row['measured_s'] * 1e3:9.2f} ms  error {row['error_pct']:+6.1f} %{spread}")


def plot_predicted_vs_measured(frame: pd.DataFrame, axis) -> None:
    """Scatter of predicted vs measured step time (ms) with the y = x line and +-10 % band; with
    several launches per strategy, a horizontal bar spans their medians (the run-to-run noise)."""
    measured_ms, predicted_ms = frame["measured_s"] * 1e3, frame["predicted_s"] * 1e3
    top = 1.1 * max(measured_ms.max(), predicted_ms.max())
    axis.plot([0, top], [0, top], color="grey", linewidth=1, label="exact")
    axis.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="grey", alpha=0.15, label="±10 %")
    for label, group in frame.groupby("strategy", sort=False):
        points = axis.scatter(group["measured_s"] * 1e3, group["predicted_s"] * 1e3, label=label, zorder=3)
        if "launches" in group and (group["launches"] > 1).any():
            low = (group["measured_s"] - group["launch_median_min_s"]).clip(lower=0) * 1e3
            high = (group["launch_median_max_s"] - group["measured_s"]).clip(lower=0) * 1e3
            axis.errorbar(group["measured_s"] * 1e3, group["predicted_s"] * 1e3, xerr=[low, high], fmt="none",
                          ecolor=points.get_facecolor()[0], elinewidth=1, capsize=2, zorder=2)
    axis.set_xlim(0, top)
    axis.set_ylim(0, top)
    axis.set_xlabel("measured step time (ms)")
    axis.set_ylabel("predicted step time (ms)")
    axis.legend(fontsize=7, loc="upper left")


def write_plot(frame: pd.DataFrame, path: Path, title: str) -> Path:
    import matplotlib  # only here: validating and summarising need no plotting library

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 5))
    plot_predicted_vs_measured(frame, axis)
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".png.tmp")
    temporary.write_bytes(buffer.getvalue())
    temporary.replace(path)
    return path


def trace_stem(label: str) -> str:
    """A strategy's label as a file name that every file system takes (no ':', which Windows
    refuses): `1f1b:4 (G=1 x M=2)` -> `1f1b-m4_G1xM2` (`KIND:m`, m micro-batches: `-m`),
    `megatron:full_shard (G=2 x M=1)` -> `megatron-full_shard_G2xM1`."""
    stem = label.replace(" ", "").replace("(", "_").replace(")", "").replace("=", "")
    return re.sub(r'[<>:"/\\|?*]', "-", re.sub(r":(\d+)", r"-m\1", stem))


def write_traces(label: str, measured_spans: list[tuple], simulated_spans: pd.DataFrame, folder: Path) -> None:
    """Measured and simulated timelines of one plan, as two Perfetto files side by side."""
    stem = trace_stem(label)
    write_json_atomic(folder / f"{stem}.measured.trace.json", trace_events(span_table(measured_spans)))
    write_json_atomic(folder / f"{stem}.simulated.trace.json", trace_events(simulated_spans))


def write_step_spans(label: str, table: pd.DataFrame, folder: Path) -> Path:
    """Every measured step's spans of one plan (`validator.validate.step_span_table`) beside its
    traces, as `<stem>.steps.csv`."""
    return write_text_atomic(folder / f"{trace_stem(label)}.steps.csv", table.to_csv(index=False))


@contextmanager
def staged_folder(out: str | Path, superseded: tuple[str, ...] = ()):
    """Yield an empty staging folder beside `out` (on its file system; inside an existing `out`
    whose parent is not writable) to write a command's results into. When the block ends without an
    error, its files move into `out`: a missing `out` is the staging folder renamed; an existing one
    gets the new files, replacing those of the same name and keeping the others, except the files
    matching a `superseded` glob (relative to `out`: an earlier run's own results), which are removed.
    On an error in the block or in the move, the staging folder is removed and `out` is left as it
    was (the files it had restored, those added removed, and so are the folders made for it)."""
    given, out = out, Path(os.path.abspath(out))
    name = f".{out.name or 'out'}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    anchor = next((folder for folder in out.parents if folder.is_dir()), out)  # nearest existing folder
    remove_stale_staging(out)
    try:
        try:
            staging = anchor / name
            staging.mkdir()
        except PermissionError:
            if not out.is_dir():
                raise
            staging = out / name
            staging.mkdir()
    except OSError as error:  # name the user's folder, not the staging one
        raise OSError(error.errno, error.strerror, str(given)) from None
    try:
        yield staging
        _publish(staging, out, superseded)
    except OSError as error:  # a file of the staging folder named as the user's file in `out`
        raise OSError(error.errno, error.strerror, _user_path(error.filename, staging, out)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _user_path(filename, staging: Path, out: Path):
    """`filename` inside `staging` (or its `.replaced.*` holding folder) as the path it has in `out`."""
    if filename is None or not str(filename).startswith(str(staging)):
        return filename
    parts = [part for part in Path(filename).relative_to(staging).parts if not part.startswith(".replaced.")]
    return str(out.joinpath(*parts))


def remove_stale_staging(out: str | Path) -> list[Path]:
    """Remove the staging folders (and writability probes) of `out` that a process killed outright
    (SIGKILL: no clean-up runs) left beside it or inside it: `.<out name>.<pid>.<8 hex>.tmp` (or
    `.probe`) whose pid is no longer alive. Those of a live process (another run writing the same
    --out now) and of this one are left alone. Returns the folders removed. Not on Windows, whose
    `os.kill` ends the process instead of probing it."""
    out = Path(os.path.abspath(out))
    if os.name == "nt":
        return []
    pattern = re.compile(re.escape(f".{out.name or 'out'}.") + r"(\d+)\.[0-9a-f]{8}\.(?:tmp|probe)")
    anchor = next((folder for folder in out.parents if folder.is_dir()), out)
    removed = []
    for place in (anchor, out) if out.is_dir() else (anchor,):
        try:
            names = os.listdir(place)
        except OSError:
            continue
        for entry in names:
            match, folder = pattern.fullmatch(entry), place / entry
            if not match or folder.is_symlink() or not folder.is_dir():
                continue
            pid = int(match.group(1))
            if pid != os.getpid() and not _alive(pid):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (signal 0 probes it): a process of another user is alive too,
    and so is a pid that cannot be probed."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # PermissionError: another user's process
        pass
    return True


def check_writable_folder(out: str | Path, option: str) -> None:
    """ScenarioError naming `option` unless `staged_folder(out)` can write: an existing `out`, or
    else its nearest existing folder, is writable, and a folder can be made where the staging one
    goes (a probe made and removed at once: /proc passes `os.access` but takes no new folder)."""
    path = Path(os.path.abspath(out))
    folder = path if path.is_dir() else next((parent for parent in path.parents if parent.is_dir()), path)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ScenarioError(f"{option} {out}: {folder} is not writable")
    anchor = next((parent for parent in path.parents if parent.is_dir()), path)
    name = f".{path.name or 'out'}.{os.getpid()}.{secrets.token_hex(4)}.probe"
    for place in (anchor, path) if path.is_dir() else (anchor,):
        try:
            (place / name).mkdir()
        except PermissionError as error:
            problem = error
            continue  # as staged_folder: inside an existing `out` whose parent is not writable
        except OSError as error:
            problem = error
            break
        (place / name).rmdir()
        return
    raise ScenarioError(f"{option} {out}: cannot make a folder in {place} ({problem.strerror or problem})")


def _publish(staging: Path, out: Path, superseded: tuple[str, ...] = ()) -> None:
    if out.exists():
        _merge(staging, out, superseded)
        return
    made = [folder for folder in out.parents if not folder.exists()]  # deepest first
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, out)
    except BaseException:
        for folder in made:
            _rmdir(folder)
        raise


def _merge(staging: Path, out: Path, superseded: tuple[str, ...] = ()) -> None:
    """Move staging's files into the existing folder `out`, and out's files that match a
    `superseded` glob and are not written anew aside; where a move fails, the moves so far are
    undone (the files replaced or set aside put back, the folders made removed) and the error raised."""
    backup = staging / f".replaced.{secrets.token_hex(4)}"
    files = sorted(path for path in staging.rglob("*") if path.is_file() or path.is_symlink())
    written = {path.relative_to(staging) for path in files}
    stale = sorted({path for pattern in superseded for path in out.glob(pattern)
                    if path.is_file() and path.relative_to(out) not in written})
    done: list[list] = []  # per file: [target, its old file's backup or None, moved?, folders made for it]
    try:
        for target in stale:
            entry = [target, backup / target.relative_to(out), False, []]
            entry[1].parent.mkdir(parents=True, exist_ok=True)
            os.replace(target, entry[1])
            done.append(entry)
        for path in files:
            relative = path.relative_to(staging)
            target = out / relative
            entry = [target, None, False, [folder for folder in target.parents
                                           if out in folder.parents and not folder.exists()]]
            done.append(entry)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_file() or target.is_symlink():
                entry[1] = backup / relative
                entry[1].parent.mkdir(parents=True, exist_ok=True)
                os.replace(target, entry[1])
            os.replace(path, target)
            entry[2] = True
    except BaseException:
        for target, saved, moved, made in reversed(done):
            if moved:
                target.unlink(missing_ok=True)
            if saved is not None:
                os.replace(saved, target)
            for folder in made:
                _rmdir(folder)
        raise


def _rmdir(folder: Path) -> None:
    """Remove `folder` if it is empty."""
    try:
        folder.rmdir()
    except OSError:
        pass
