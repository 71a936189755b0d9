"""Which messages pay the tails: sends that meet a send the other way, and waits on arrived messages.

Reads either a cycle's records (`cycle_records.py`, JSON) or a validation's step spans
(`ghpsim validate --step-spans`, `<strategy>.steps.csv`) and prints, per input:

- sends: the share whose `isend` started within 0.05 and 0.1 ms of a send the other way on the same
  pair of ranks ("collided"), their mean and median call against the other sends';
- arrived receives (sent at least `READY_MARGIN_S` before the wait began, as the calibration counts
  them): count, mean and median wait, the share over 0.3 ms, split by whether the message's `isend`
  call was still running when the wait began.

Step-span times are from each rank's own step start (the ranks leave a barrier together; their
offsets are tens of microseconds), so the 0.05 ms bin is approximate there.

    python reports/diagnostics/ws2_message_tails/message_tails.py FILE [FILE ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from validator.handoff_bench import READY_MARGIN_S

SLOW_S = 0.0003
"""A call or wait past 0.3 ms is in the tail (medians here are 0.03-0.15 ms)."""


def cycle_tables(path: Path) -> tuple[pd.DataFrame, pd.DataFrame, range]:
    """(sends, receives) of a cycle's records, every message, and its steady state's micro-batches."""
    document = json.loads(path.read_text())
    world, microbatches = document["world_size"], document["microbatches"]
    sends = pd.DataFrame(document["sends"], columns=["rank", "run", "direction", "microbatch", "target",
                                                     "start_s", "call_s"])
    receives = pd.DataFrame(document["receives"], columns=["run", "direction", "microbatch", "rank",
                                                           "wait_from_s", "wait_end_s"])
    return sends, receives, range(world, microbatches - world)


def cycle_messages(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(sends, receives) of a cycle's records, steady state only (the benchmark's own window)."""
    sends, receives, steady = cycle_tables(path)
    return (sends[sends.microbatch.isin(steady)].reset_index(drop=True),
            receives[receives.microbatch.isin(steady)].reset_index(drop=True))


def span_messages(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(sends, receives) of a step-span table, in the cycle's columns (run = launch x step)."""
    table = pd.read_csv(path)
    table["run"] = table["launch"] * 1000 + table["step"]
    message = table["name"].str.extract(r"^(send|recv) (act|grad)")
    table["direction"] = message[1].map({"act": 1, "grad": -1})
    sends = table[message[0] == "send"].rename(columns={"duration_s": "call_s"})
    sends = sends.assign(target=sends["rank"] + sends["direction"])
    receives = table[message[0] == "recv"].rename(columns={"start_s": "wait_from_s", "end_s": "wait_end_s"})
    keep = ["rank", "run", "direction", "microbatch", "target", "start_s", "call_s"]
    return (sends[keep].reset_index(drop=True),
            receives[["run", "direction", "microbatch", "rank", "wait_from_s", "wait_end_s"]].reset_index(drop=True))


def with_collision_gap(sends: pd.DataFrame) -> pd.DataFrame:
    """Each send with `gap_s`: to the nearest send the other way on the same pair in the same run."""
    gaps = []
    for (run,), group in sends.groupby(["run"]):
        for index, send in group.iterrows():
            other = group[(group["rank"] == send["target"]) & (group["target"] == send["rank"])]
            gaps.append((index, (other["start_s"] - send["start_s"]).abs().min() if len(other) else float("inf")))
    gap = pd.Series(dict(gaps))
    return sends.assign(gap_s=gap)


def arrived_receives(sends: pd.DataFrame, receives: pd.DataFrame) -> pd.DataFrame:
    """Receives whose message was sent at least READY_MARGIN_S before the wait began, with `wait_s`
    and `send_running` (its isend call had not returned when the wait began)."""
    matched = receives.merge(sends, left_on=["run", "direction", "microbatch", "rank"],
                             right_on=["run", "direction", "microbatch", "target"], suffixes=("", "_sender"))
    arrived = matched[matched["wait_from_s"] - matched["start_s"] >= READY_MARGIN_S].copy()
    arrived["wait_s"] = arrived["wait_end_s"] - arrived["wait_from_s"]
    arrived["send_running"] = arrived["start_s"] + arrived["call_s"] > arrived["wait_from_s"]
    return arrived


def _ms(series: pd.Series) -> str:
    return f"mean {series.mean() * 1e3:5.2f} median {series.median() * 1e3:5.2f} ms" if len(series) else "(none)"


def report(path: Path) -> str:
    sends, receives = (cycle_messages if path.suffix == ".json" else span_messages)(path)
    sends = with_collision_gap(sends)
    lines = [f"## {path.name}: {len(sends)} sends, {len(receives)} receives"]
    for window_s in (0.00005, 0.0001):
        collided = sends["gap_s"] < window_s
        lines.append(f"  sends within {window_s * 1e3:.2f} ms of one the other way: {collided.mean() * 100:5.1f} % "
                     f"(isend {_ms(sends[collided]['call_s'])}, over 0.3 ms {(sends[collided]['call_s'] > SLOW_S).mean() * 100:3.0f} %); "
                     f"the rest {_ms(sends[~collided]['call_s'])}, over 0.3 ms {(sends[~collided]['call_s'] > SLOW_S).mean() * 100:3.0f} %")
    arrived = arrived_receives(sends, receives)
    lines.append(f"  arrived receives: {len(arrived)}, wait {_ms(arrived['wait_s'])}, "
                 f"over 0.3 ms {(arrived['wait_s'] > SLOW_S).mean() * 100:3.0f} %")
    for running, group in arrived.groupby("send_running"):
        label = "its isend still running" if running else "its isend returned"
        lines.append(f"    {label:24s} {len(group):4d}: wait {_ms(group['wait_s'])}, "
                     f"over 0.3 ms {(group['wait_s'] > SLOW_S).mean() * 100:3.0f} %")
    return "\n".join(lines)


def main() -> int:
    paths = [Path(argument) for argument in sys.argv[1:]]
    missing = [str(path) for path in paths if not path.is_file()]
    if not paths or missing:
        print(f"usage: message_tails.py FILE [FILE ...] (cycle_records.py JSON or a .steps.csv)"
              + (f"; no such file: {', '.join(missing)}" if missing else ""), file=sys.stderr)
        return 2
    for path in paths:
        print(report(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
