"""Where the slow waits on arrived messages fall: by what the other ranks and the waiting rank did.

For each wait on an arrived message (sent at least `READY_MARGIN_S` before the wait began, its isend
returned; the cycle's steady state only) of a cycle's records (`cycle_records.py`, JSON) or a
validation's step spans (`<strategy>.steps.csv[.gz]`), prints the count, mean wait and share over
0.3 ms split two ways:
- `idle_others`: how many other ranks were blocked in a receive (or outside their run) when it began;
- `after_wake`: whether the rank's last send, ending under 0.5 ms before, went to a rank that was
  blocked waiting for it.

    python reports/diagnostics/ws2_message_tails/wait_context.py FILE [FILE ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from message_tails import SLOW_S, cycle_tables, span_messages
from validator.handoff_bench import READY_MARGIN_S

RECENT_S = 0.0005


def messages(path: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(receives joined with their sends, arrived waits, each rank's run extent)."""
    if path.suffix == ".json":
        sends, receives, steady = cycle_tables(path)
        extent = receives.groupby(["run", "rank"]).agg(first_s=("wait_from_s", "min"), last_s=("wait_end_s", "max"))
    else:
        sends, receives = span_messages(path)
        steady = None
        table = pd.read_csv(path)
        table["run"] = table["launch"] * 1000 + table["step"]
        extent = table.groupby(["run", "rank"]).agg(first_s=("start_s", "min"), last_s=("end_s", "max"))
    joined = receives.merge(sends.rename(columns={"rank": "source", "target": "rank"}),
                            on=["run", "direction", "microbatch", "rank"])
    joined["wait_s"] = joined["wait_end_s"] - joined["wait_from_s"]
    joined["woke"] = joined["wait_from_s"] < joined["start_s"]
    arrived = joined[(joined["wait_from_s"] - joined["start_s"] >= READY_MARGIN_S)
                     & (joined["wait_from_s"] > joined["start_s"] + joined["call_s"])].copy()
    if steady is not None:
        arrived = arrived[arrived["microbatch"].isin(steady)]
    return joined, arrived, extent


def idle_others(row, blocked: pd.DataFrame, extent: pd.DataFrame, ranks: list[int]) -> int:
    count = 0
    for other in ranks:
        if other == row["rank"]:
            continue
        spans = blocked[(blocked["run"] == row["run"]) & (blocked["rank"] == other)]
        inside = ((spans["wait_from_s"] <= row["wait_from_s"]) & (spans["wait_end_s"] >= row["wait_from_s"])).any()
        first_s, last_s = extent.loc[(row["run"], other)] if (row["run"], other) in extent.index else (1.0, 0.0)
        count += bool(inside or not first_s <= row["wait_from_s"] <= last_s)
    return count


def after_wake(row, sends: pd.DataFrame) -> bool:
    mine = sends[(sends["run"] == row["run"]) & (sends["source"] == row["rank"]) & (sends["start_s"] < row["wait_from_s"])]
    if mine.empty:
        return False
    last = mine.loc[mine["start_s"].idxmax()]
    return bool(last["woke"]) and row["wait_from_s"] - last["start_s"] - last["call_s"] < RECENT_S


def summary(arrived: pd.DataFrame, column: str) -> str:
    table = arrived.groupby(column).agg(n=("wait_s", "size"), mean_ms=("wait_s", lambda w: w.mean() * 1e3),
                                        over_0_3ms=("wait_s", lambda w: (w > SLOW_S).mean()))
    return table.round(3).to_string()


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: wait_context.py FILE [FILE ...]", file=sys.stderr)
        return 2
    for name in sys.argv[1:]:
        path = Path(name)
        if not path.exists():
            print(f"FILE: not found: {name}", file=sys.stderr)
            return 2
        joined, arrived, extent = messages(path)
        blocked = joined[joined["wait_from_s"] < joined["start_s"] + joined["call_s"]]
        ranks = sorted(joined["rank"].unique())
        arrived["idle_others"] = arrived.apply(idle_others, axis=1, args=(blocked, extent, ranks))
        arrived["after_wake"] = arrived.apply(after_wake, axis=1, args=(joined,))
        print(f"## {path.name}: {len(arrived)} waits on arrived messages")
        print(summary(arrived, "idle_others"))
        print(summary(arrived, "after_wake"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
