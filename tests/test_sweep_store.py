"""The sweep store: schema, WAL mode, skip set, and refusal (one line, exit 2, file untouched) of
foreign, damaged or non-database files."""

from __future__ import annotations

import sqlite3

import pytest

from ghpsim.cli import main
from simulator.errors import ScenarioError
from simulator.sweep.store import STORE_NAME, SweepStore

OUTCOME = {"status": "ok", "error": None, "summary_json": '{"step_time_s":0.5,"devices":[]}',
           "figures": {"step_time_s": 0.5}, "wall_s": 0.01}


def test_rows_round_trip_and_skip_set(tmp_path):
    path = tmp_path / STORE_NAME
    with SweepStore(path, run_id="first") as store:
        store.put("a", "{}", OUTCOME)
        store.put("b", "{}", {"status": "failed", "error": "point 1: bad", "wall_s": 0.0})
        store.put("c", "{}", {"status": "error", "error": "TypeError: x", "wall_s": None})
        assert store.done_keys() == {"a", "b"}  # `error` rows are retried
    with SweepStore(path, run_id="second") as store:
        rows = store.rows()
        assert rows["a"]["figures"] == {"step_time_s": 0.5} and rows["a"]["run_id"] == "first"
        assert store.summary("a") == {"step_time_s": 0.5, "devices": []}
        assert rows["b"]["error"] == "point 1: bad" and rows["b"]["figures"] is None
        assert store.summary("b") is None and store.summary("missing") is None
        store.put("c", "{}", OUTCOME)  # a retried point replaces its row, keeping one row per key
        assert store.rows()["c"]["status"] == "ok" and store.rows()["c"]["run_id"] == "second"
        assert len(store.rows()) == 3
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert dict(connection.execute("SELECT name, value FROM ghpsim_meta")) == {
        "schema": "ghpsim-sweep-store", "schema_version": "1"}
    connection.close()


def _foreign_sqlite(path):
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    connection.execute("INSERT INTO customers VALUES (1, 'Ada')")
    connection.commit()
    connection.close()


def _damaged_store(path):
    with SweepStore(path) as store:
        for index in range(200):
            store.put(f"key{index}", "{}" * 200, OUTCOME)
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    data = bytearray(path.read_bytes())
    data[4096:len(data) - 4096] = b"\xa5" * (len(data) - 8192)  # pages after the first overwritten
    path.write_bytes(bytes(data))


def _other_schema_version(path):
    with SweepStore(path):
        pass
    connection = sqlite3.connect(path)
    connection.execute("UPDATE ghpsim_meta SET value = '7' WHERE name = 'schema_version'")
    connection.commit()
    connection.close()


@pytest.mark.parametrize("make, message", [
    (lambda path: path.write_text("step_time_s,point\n1,2\n"), "not a SQLite database"),
    (lambda path: path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 50), "damaged SQLite database"),
    (_foreign_sqlite, "a SQLite database of another schema (tables: customers)"),
    (_damaged_store, "damaged SQLite database"),
    (_other_schema_version, "store schema version '7'"),
    (lambda path: path.mkdir(), "not a regular file"),
])
def test_refuses_foreign_or_damaged_files_without_touching_them(tmp_path, make, message):
    path = tmp_path / STORE_NAME
    make(path)
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(ScenarioError) as caught:
        SweepStore(path)
    text = str(caught.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text, text
    assert (path.read_bytes() if path.is_file() else None) == before


def test_cli_exits_2_with_one_line_on_a_foreign_store(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: {model: {name: mlp}, training: {global_batch_size: 8}}\n"
                     "axes: {cluster.gpus_per_node: [1]}\n")
    out = tmp_path / "out"
    out.mkdir()
    _foreign_sqlite(out / STORE_NAME)
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ghpsim: error: ") and "another schema" in err
    assert "Traceback" not in err
