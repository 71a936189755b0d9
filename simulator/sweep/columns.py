"""The columns of a sweep's results.csv (`simulator.sweep.export` writes them; `simulator.sweep.spec`
refuses an axis named as one of them). No pandas here: a sweep file is checked without it."""

from __future__ import annotations

SUMMARY_FIGURES = ("scenario", "model", "strategy", "num_gpus", "num_groups", "workers_per_group",
                   "global_batch_size", "step_time_s", "throughput_samples_per_s", "speedup",
                   "single_device_step_s")
"""Summary keys copied as they are into a result row (the summary's own names and units)."""
INTEGER_FIGURES = ("num_gpus", "num_groups", "workers_per_group", "global_batch_size")
"""Summary figures that are counts: integer columns (Int64, empty where missing), never 4.0."""
MEMORY_FIGURES = ("peak_memory_bytes", "fits_in_memory")


def result_columns(axis_columns: list[str]) -> list[str]:
    """The columns of results.csv, in order, around the swept fields' `axis_columns`."""
    return ["point", *axis_columns, "status", "error", "key", *SUMMARY_FIGURES, "intra_node_bytes",
            "inter_node_bytes", *MEMORY_FIGURES, "sim_wall_s"]
