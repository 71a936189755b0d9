"""benchmarks/step_spans.py: the per-pass figures of a `ghpsim validate --step-spans` table."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import step_spans  # noqa: E402


def test_pass_names_drop_the_microbatch_index():
    assert step_spans.pass_name("B12 L3-6") == "B L3-6"
    assert step_spans.pass_name("F0 L0-2") == "F L0-2"
    assert step_spans.pass_name("send act1") == "send act"
    assert step_spans.pass_name("recv grad10") == "recv grad"
    assert step_spans.pass_name("optimizer") == "optimizer"
    assert step_spans.pass_name("stash3 L0-2") == "stash L0-2"
    assert step_spans.pass_name("accumulate12 L8-10") == "accumulate L8-10"


def _steps() -> pd.DataFrame:
    """Two steps of one launch, rank 0: two forwards (1 + 3 ms, then 2 + 2 ms) and one send (1, 9 ms)."""
    rows = []
    for step, (forwards_ms, send_ms) in enumerate((((1.0, 3.0), 1.0), ((2.0, 2.0), 9.0))):
        start = 0.0
        for microbatch, duration_ms in enumerate(forwards_ms):
            rows.append((0, step, 0, "compute", f"F{microbatch} L0-2", "F", start, start + duration_ms / 1e3, 0.0, microbatch))
            start += duration_ms / 1e3
        rows.append((0, step, 0, "send", "send act0", "send", start, start + send_ms / 1e3, 64.0, 0))
    frame = pd.DataFrame(rows, columns=["launch", "step", "rank", "stream", "name", "kind", "start_s", "end_s",
                                        "size_bytes", "microbatch"])
    return frame.assign(duration_s=frame["end_s"] - frame["start_s"])


def test_measured_table_counts_medians_tails_and_step_sums():
    table = step_spans.measured_table(_steps())
    forward, send = table.loc[(0, "F L0-2")], table.loc[(0, "send act")]
    assert forward["per_step"] == 2 and send["per_step"] == 1
    assert forward["median_ms"] == pytest.approx(2.0) and forward["max_ms"] == pytest.approx(3.0)
    assert forward["step_sum_median_ms"] == pytest.approx(4.0)  # both steps' forwards sum to 4 ms
    assert forward["per_microbatch_ms"] == pytest.approx(2.0)  # two micro-batches a step
    assert send["per_microbatch_ms"] == pytest.approx(send["step_sum_median_ms"] / 2)
    assert send["median_ms"] == pytest.approx(5.0) and send["max_ms"] == pytest.approx(9.0)


def test_cpu_columns_split_a_pass_into_work_and_time_off_a_core():
    steps = _steps()
    steps["cpu_s"] = [0.001, 0.001, float("nan"), 0.002, 0.001, float("nan")]  # forwards 1+3, 2+2 ms wall
    forward = step_spans.measured_table(steps).loc[(0, "F L0-2")]
    assert forward["cpu_median_ms"] == pytest.approx(1.0) and forward["cpu_mean_ms"] == pytest.approx(1.25)
    assert forward["waited_pct"] == pytest.approx(100 * (1 - 5.0 / 8.0))  # 5 ms on a core of 8 ms
    assert pd.isna(step_spans.measured_table(steps).loc[(0, "send act"), "waited_pct"])


def test_main_sets_the_simulated_median_beside_and_refuses_a_missing_file(tmp_path, capsys):
    csv = tmp_path / "case.steps.csv"
    _steps().to_csv(csv, index=False)
    trace = tmp_path / "case.simulated.trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": f"F{i} L0-2", "pid": 0, "tid": 0, "ts": 0.0, "dur": 1000.0} for i in range(2)]}))
    assert step_spans.main([str(csv), "--simulated", str(trace)]) == 0
    printed = capsys.readouterr().out
    forward_line = next(line for line in printed.splitlines() if "F L0-2" in line)
    assert forward_line.split()[-2:] == ["1.0", "2.0"]  # simulated 1 ms, measured / simulated 2
    assert step_spans.main([str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err
