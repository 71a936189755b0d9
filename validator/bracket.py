"""Calibrations before and after a batch of runs, pooled ("bracketing", `simulator.profile_merge`):
a host whose speed drifts over minutes meets the runs between the two calibrations, and the pooled
profile samples the machine on both sides of them. Microbenchmarks only, as any profile.

Measured on this project's 2-core host (reports/ACCURACY.md): pooling a calibration taken after
the validation runs with the one before did not improve the prediction (15 cases: MAPE 15.0 %
pooled against 14.3 % from the calibration before alone; under pass jitter 9.0 against 8.9 %):
there the error is not a drift between calibration and runs. It stays an option
(`ghpsim validate --bracket`, the benchmarks' `--bracket`) for hosts where it is."""

from __future__ import annotations

import json
from pathlib import Path

from simulator.profile_merge import merge_profile_files
from validator.calibrate import calibrate


def settings_of(profile: dict) -> dict:
    """The calibration settings that make a new calibration measure what `profile` measured (the same
    batch sizes, message sizes, densities and passes, so that the two can be pooled): the profile's
    `method.settings` where it records them, else what its figures show."""
    recorded = dict(profile.get("method", {}).get("settings") or {})
    if recorded:
        recorded["batch_sizes"] = tuple(recorded["batch_sizes"])
        recorded["comm_sizes"] = tuple(recorded["comm_sizes"])
        return recorded
    settings = {"batch_sizes": tuple(profile["layers"][0]["batch_sizes"]),
                "topk_densities": [float(density) for density in profile.get("topk", {})],
                "jitter_passes": (profile.get("pass_jitter") or {}).get("passes_per_burst", 0)}
    if profile.get("p2p"):
        settings["comm_sizes"] = tuple(profile["p2p"]["sizes_bytes"])
    passes = profile.get("method", {}).get("layer_passes")
    if passes:
        settings["layer_passes"] = passes["passes"]
    return {key: value for key, value in settings.items() if value}


def bracketing_profile(before: Path, workload, model_params: dict, reuse: bool = False) -> Path:
    """Calibrates again now, with the settings of the calibration `before` (`settings_of`), into
    `<before>_after.json` (reused when `reuse` and it exists) and pools the two into
    `<before>_bracketed.json`; returns the pooled profile's path."""
    before = Path(before)
    profile = json.loads(before.read_text())
    after = before.with_name(f"{before.stem}_after.json")
    if not (reuse and after.exists()):
        calibrate(workload, model_params, after, device=profile["device"]["kind"], world_size=profile["world_size"],
                  optimizer=profile["optimizer"]["name"], verbose=False, **settings_of(profile))
    pooled = before.with_name(f"{before.stem}_bracketed.json")
    merge_profile_files([before, after], pooled)
    return pooled
