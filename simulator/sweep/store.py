"""The sweep store: one SQLite file (WAL mode) with one row per finished scenario, keyed by the
scenario's hash and committed as soon as the point finishes, so a killed sweep keeps every
finished point.

WAL with synchronous=NORMAL: a committed row survives a crash of the process (SIGKILL); only a
power loss may lose the last commits. A file that is not a SQLite database, a SQLite database
of another schema, or a damaged one is refused with a one-line error and never overwritten.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from simulator.errors import ScenarioError

SCHEMA = "ghpsim-sweep-store"
SCHEMA_VERSION = "1"
STORE_NAME = "sweep.sqlite"
SQLITE_MAGIC = b"SQLite format 3\x00"
DONE_STATUSES = ("ok", "failed")
"""Statuses that a re-run skips; `error` (an unexpected exception, a lost worker) is retried."""

_CREATE = (
    "CREATE TABLE IF NOT EXISTS ghpsim_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY,"
    " status TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'error')), error TEXT, scenario_json TEXT NOT NULL,"
    " summary_json TEXT, figures_json TEXT, sim_wall_s REAL, finished_at REAL NOT NULL, run_id TEXT NOT NULL)",
)
_COLUMNS = ("key", "status", "error", "scenario_json", "summary_json", "figures_json", "sim_wall_s", "finished_at",
            "run_id")
_PUT = (f"INSERT INTO results ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"
        " ON CONFLICT (key) DO UPDATE SET "
        + ", ".join(f"{column} = excluded.{column}" for column in _COLUMNS[1:] if column != "scenario_json"))


class SweepStore:
    """Open (or create) the store at `path`; refuse anything that is not ours."""

    def __init__(self, path: str | Path, run_id: str = ""):
        self.path = Path(path)
        self.run_id = run_id or f"{time.time():.6f}"
        _check_file(self.path)
        try:
            self.connection = sqlite3.connect(self.path, timeout=30.0)
        except sqlite3.Error as error:
            raise self._fail(f"cannot open ({error})") from None
        try:
            self._prepare()
        except sqlite3.DatabaseError as error:
            self.connection.close()
            raise self._fail(f"damaged SQLite database ({error})") from None
        except ScenarioError:
            self.connection.close()
            raise

    def _fail(self, problem: str) -> ScenarioError:
        return store_error(self.path, problem)

    def _prepare(self) -> None:
        db = self.connection
        db.execute("PRAGMA busy_timeout = 30000")
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            with db:
                for statement in _CREATE:
                    db.execute(statement)
                db.executemany("INSERT OR IGNORE INTO ghpsim_meta VALUES (?, ?)",
                               [("schema", SCHEMA), ("schema_version", SCHEMA_VERSION)])
        elif "ghpsim_meta" not in tables or "results" not in tables:
            raise self._fail(f"a SQLite database of another schema (tables: {', '.join(sorted(tables))})")
        meta = dict(db.execute("SELECT name, value FROM ghpsim_meta"))
        if meta.get("schema") != SCHEMA:
            raise self._fail(f"a SQLite database of another schema (schema {meta.get('schema')!r})")
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise self._fail(f"store schema version {meta.get('schema_version')!r}, this ghpsim "
                             f"reads {SCHEMA_VERSION!r}")
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise self._fail(f"damaged SQLite database ({check})")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")

    def done_keys(self) -> set[str]:
        """Keys of points that a re-run skips (finished ok or failed deterministically)."""
        marks = ", ".join("?" for _ in DONE_STATUSES)
        return {key for (key,) in self._query(f"SELECT key FROM results WHERE status IN ({marks})",
                                              DONE_STATUSES)}

    def put(self, key: str, scenario_json: str, outcome: dict) -> None:
        """Record one finished point and commit at once. `outcome`: status, error, summary_json (text),
        figures (a small mapping of key figures), wall_s."""
        figures = outcome.get("figures")
        row = (key, outcome["status"], outcome.get("error"), scenario_json, outcome.get("summary_json"),
               None if figures is None else json.dumps(figures, separators=(",", ":")),
               outcome.get("wall_s"), time.time(), self.run_id)
        try:
            with self.connection:
                self.connection.execute(_PUT, row)
        except sqlite3.DatabaseError as error:
            raise self._fail(f"write failed ({error})") from None

    def rows(self) -> dict[str, dict]:
        """Every stored row by key: status, error, figures (a dict or None), sim_wall_s, finished_at, run_id."""
        query = "SELECT key, status, error, figures_json, sim_wall_s, finished_at, run_id FROM results"
        return {key: {"status": status, "error": error, "figures": json.loads(figures) if figures else None,
                      "sim_wall_s": wall_s, "finished_at": finished_at, "run_id": run_id}
                for key, status, error, figures, wall_s, finished_at, run_id in self._query(query)}

    def summary(self, key: str) -> dict | None:
        """The full simulation summary stored for `key` (None if absent or not simulated)."""
        found = self._query("SELECT summary_json FROM results WHERE key = ?", (key,))
        return json.loads(found[0][0]) if found and found[0][0] else None

    def _query(self, sql: str, parameters=()) -> list[tuple]:
        try:
            return self.connection.execute(sql, parameters).fetchall()
        except sqlite3.DatabaseError as error:
            raise self._fail(f"read failed ({error})") from None

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> "SweepStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def store_error(path: Path, problem: str) -> ScenarioError:
    return ScenarioError(f"{path}: {problem}; not a usable ghpsim sweep store (move it away or choose "
                         f"another --out)")


def _check_file(path: Path) -> None:
    if path.exists() and not path.is_file():
        raise store_error(path, "not a regular file")
    if path.is_file() and path.stat().st_size > 0:
        with path.open("rb") as stream:
            header = stream.read(len(SQLITE_MAGIC))
        if header != SQLITE_MAGIC:
            raise store_error(path, "not a SQLite database")
