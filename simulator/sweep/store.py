"""The sweep store: one SQLite file (WAL mode) with one row per finished scenario, keyed by the
scenario's hash and committed as soon as the point finishes, so a killed sweep keeps every
finished point.

WAL with synchronous=NORMAL: a committed row survives a crash of the process (SIGKILL); only a
power loss may lose the last commits. A file that is not a SQLite database, a SQLite database
of another schema, an empty file, or a damaged one is refused with a one-line error and never
overwritten. Each row carries a sha256 of its columns, verified whenever the store is opened
(a resumed sweep never trusts a changed row). A new store is built aside and renamed into place,
so a crash never leaves a half-made one. An open store holds a lock (`<store>.lock`, released by
the OS when the process ends however it ends), so a second sweep on the same folder refuses.
Closing the store removes the lock file; one left by a killed sweep is held by no one, and the
next sweep takes it over.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

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
    " summary_json TEXT, figures_json TEXT, sim_wall_s REAL, finished_at REAL NOT NULL, run_id TEXT NOT NULL,"
    " checksum TEXT)",
)
_COLUMNS = ("key", "status", "error", "scenario_json", "summary_json", "figures_json", "sim_wall_s", "finished_at",
            "run_id")
_STORED = (*_COLUMNS, "checksum")
_PUT = (f"INSERT INTO results ({', '.join(_STORED)}) VALUES ({', '.join('?' for _ in _STORED)})"
        " ON CONFLICT (key) DO UPDATE SET " + ", ".join(f"{column} = excluded.{column}" for column in _STORED[1:]))


def row_checksum(row: tuple) -> str:
    """sha256 of a row's columns (`_COLUMNS` order), as stored in its `checksum` column."""
    return hashlib.sha256(json.dumps(list(row), separators=(",", ":")).encode("utf-8")).hexdigest()


class SweepStore:
    """Open (or create) the store at `path`; refuse anything that is not ours."""

    def __init__(self, path: str | Path, run_id: str = ""):
        self.path = Path(path)
        self.run_id = run_id or f"{time.time():.6f}"
        self._lock = take_lock(self.path)
        try:
            _check_file(self.path)
            if not self.path.exists():
                _create(self.path)
            self.connection = sqlite3.connect(self.path, timeout=30.0)
        except sqlite3.Error as error:
            self._lock.close()
            raise self._fail(f"cannot open ({error})") from None
        except BaseException:
            self._lock.close()
            raise
        try:
            self._prepare()
        except sqlite3.DatabaseError as error:
            self.close()
            raise self._fail(f"damaged SQLite database ({error})") from None
        except BaseException:
            self.close()
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
        if "checksum" not in {row[1] for row in db.execute("PRAGMA table_info(results)")}:
            self._add_checksums()
        self._verify()

    def _add_checksums(self) -> None:
        """A store written before rows had checksums: each row gets its checksum once, now."""
        with self.connection as db:
            db.execute("ALTER TABLE results ADD COLUMN checksum TEXT")
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM results").fetchall()
            db.executemany("UPDATE results SET checksum = ? WHERE key = ?", [(row_checksum(row), row[0]) for row in rows])

    def _verify(self) -> None:
        """Refuse the store when a row does not match its checksum (or cannot be read)."""
        bad = [row[0] for row in self.connection.execute(f"SELECT {', '.join(_STORED)} FROM results")
               if row[-1] != row_checksum(row[:-1])]
        if bad:
            raise self._fail(f"damaged: {len(bad)} row(s) do not match their checksum (first key {bad[0][:16]!r})")

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
        row = (*row, row_checksum(row))
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
        """Close the database and release the lock."""
        if getattr(self, "connection", None) is not None:
            self.connection.close()
            self.connection = None
        self._lock.close()

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
    if path.is_file():
        with path.open("rb") as stream:
            header = stream.read(len(SQLITE_MAGIC))
        if not header:
            raise store_error(path, "an empty file (0 bytes), not a store this ghpsim wrote")
        if header != SQLITE_MAGIC:
            raise store_error(path, "not a SQLite database")


def _create(path: Path) -> None:
    """A new, empty store: built under a temporary name, then renamed into place."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.new")
    temporary.unlink(missing_ok=True)
    try:
        connection = sqlite3.connect(temporary)
        try:
            with connection:
                for statement in _CREATE:
                    connection.execute(statement)
                connection.executemany("INSERT INTO ghpsim_meta VALUES (?, ?)",
                                       [("schema", SCHEMA), ("schema_version", SCHEMA_VERSION)])
        finally:
            connection.close()
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


LOCK_TRIES = 100
"""Attempts to take a lock file that its holders keep removing (each removal ends one attempt)."""


class StoreLock:
    """`<store>.lock` held exclusively (flock; msvcrt on Windows) while the store is open; `close()`
    removes the file and releases the lock. ScenarioError, naming the holder's process id, when
    another process holds it."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + ".lock")
        for _ in range(LOCK_TRIES):
            handle = _open_locked(self.path, path)
            if _names_file(self.path, handle):
                break
            handle.close()  # its holder removed it between our open and our lock: take the new one
        else:
            raise ScenarioError(f"{self.path}: the lock file keeps changing; is another ghpsim sweep starting "
                                "and ending on this folder? Choose another --out")
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self.handle = handle

    def close(self) -> None:
        """Remove the lock file and release the lock (closing twice is harmless)."""
        handle, self.handle = getattr(self, "handle", None), None
        if handle is None:
            return
        ours = _names_file(self.path, handle)
        try:
            if ours and fcntl is not None:  # removed while held: a process that opened it re-checks
                self.path.unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            handle.close()
        if ours and fcntl is None:  # Windows: not removable while open; fails if another process opened it
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass


def take_lock(path: Path) -> StoreLock:
    """The lock of the store at `path` (`StoreLock`); `close()` it to release it."""
    return StoreLock(path)


def _open_locked(lock_path: Path, store_path: Path):
    """`lock_path` opened and locked, or ScenarioError."""
    try:
        handle = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 (held until close)
    except OSError as error:
        raise ScenarioError(f"{lock_path}: cannot open the sweep's lock file ({error.strerror or error}); "
                            "remove it or choose another --out") from None
    try:
        handle.seek(0)
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
    except OSError:
        handle.seek(0)
        try:
            holder = handle.read(32).strip() or "unknown"
        except OSError:  # Windows: the locked byte cannot be read
            holder = "unknown"
        handle.close()
        raise ScenarioError(f"{store_path}: in use by another ghpsim sweep (process {holder}); wait for it to end "
                            "or choose another --out") from None
    return handle


def _names_file(path: Path, handle) -> bool:
    """Whether `path` still names the open file `handle`."""
    try:
        named, held = os.stat(path), os.fstat(handle.fileno())
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
