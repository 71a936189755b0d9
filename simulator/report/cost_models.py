"""The cost model a result records, for the report's "costs" line: each summary's `compute_model`
(`simulator.costs.describe_compute_model`: model kernel, analytic or profile, and a note on why),
or, for a sweep, those of its points in the sweep store beside results.csv (`sweep.sqlite`,
read only; results.csv itself records no cost model). Nothing is guessed where none is recorded."""

from __future__ import annotations

import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path

from simulator.tables import strategy_label

STORE_NAME = "sweep.sqlite"
NOT_RECORDED = "not recorded"
_QUERY = ("SELECT key, json_extract(summary_json, '$.compute_model.model'), "
          "json_extract(summary_json, '$.compute_model.note') FROM results WHERE status = 'ok'")


def model_text(compute_model) -> str:
    """`kernel model (costs.model auto: volta kernel figures)`, or NOT_RECORDED."""
    if not isinstance(compute_model, dict) or not compute_model.get("model"):
        return NOT_RECORDED
    note = compute_model.get("note")
    return f"{compute_model['model']} model" + (f" ({note})" if note else "")


def summaries_text(summaries: list[dict]) -> str:
    """The cost model of the summaries: one text if they agree, else one per strategy."""
    texts = [model_text(summary.get("compute_model")) for summary in summaries]
    if len(set(texts)) == 1:
        return _recorded(texts[0], "the result")
    return "; ".join(f"{strategy_label(summary)}: {text}" for summary, text in zip(summaries, texts))


def _recorded(text: str, where: str) -> str:
    return f"{NOT_RECORDED} in {where}" if text == NOT_RECORDED else text


def sweep_costs(csv_path: Path, keys: list[str]) -> Counter | None:
    """Cost model text -> number of the simulated points (`keys`, results.csv's `key` column) that
    record it in the sweep store beside `csv_path`; None if there is no readable store."""
    store = csv_path.parent / STORE_NAME
    if not store.is_file():
        return None
    try:  # immutable: no lock and no -wal/-shm files written into the sweep's folder
        mode = "mode=ro" if store.with_name(STORE_NAME + "-wal").is_file() else "immutable=1"
        with closing(sqlite3.connect(f"{store.resolve().as_uri()}?{mode}", uri=True)) as connection:
            rows = connection.execute(_QUERY).fetchall()
    except sqlite3.Error:
        return None
    wanted = set(keys)
    found = {key: model_text({"model": model, "note": note}) for key, model, note in rows if key in wanted}
    return Counter(found.get(key, NOT_RECORDED) for key in keys)


def sweep_text(counts: Counter | None) -> str:
    """The cost model of a sweep's simulated points (see `sweep_costs`)."""
    if counts is None:
        return (f"{NOT_RECORDED} in results.csv (each point's cost model is in the sweep store, "
                f"{STORE_NAME}, which is not beside it or not readable)")
    if not counts:
        return f"{NOT_RECORDED}: no point was simulated"
    if len(counts) == 1:
        return _recorded(next(iter(counts)), f"the sweep store ({STORE_NAME})") + \
            f" for every simulated point (as the sweep store, {STORE_NAME}, records)"
    return "; ".join(f"{text} for {count} points" for text, count in counts.most_common()) + \
        f" (as the sweep store, {STORE_NAME}, records)"
