"""Parameter sweeps: a sweep file (spec), a crash-safe SQLite store, parallel runners (local
process pool or dask.distributed), and CSV/Parquet export. CLI: `ghpsim sweep` (command)."""

from simulator.sweep.runner import SweepReport, run_sweep
from simulator.sweep.spec import Sweep, load_sweep, scenario_key

__all__ = ["Sweep", "SweepReport", "load_sweep", "run_sweep", "scenario_key"]
