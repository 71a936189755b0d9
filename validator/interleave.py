"""Calibration slices interleaved with a validation's launch rounds, pooled into one profile.

Why: on this project's 2-core host the error of a validation is mostly one level per calibration
(reports/ACCURACY.md: with each profile's mean signed error removed, MAPE 4.4 % instead of 12.1 %).
A calibration samples a minute or two of a machine whose speed wanders over minutes; the runs it
predicts sample other minutes. Bracketing (`validator.bracket`) samples both sides of the runs;
this samples *among* them: after every `every_rounds` launch rounds a short calibration (one layer
sweep, `layer_passes=1`, otherwise the settings of the calibration before the runs,
`validator.bracket.settings_of`) runs between the rounds, and the calibration before the runs and
all slices are pooled (`simulator.profile_merge`: numbers averaged, whole-model pass rows pooled).
Only microbenchmarks enter the pooled profile; the plan runs stay the held-out test. The price is
the slices' time (measured: 42-48 s each at 2 ranks against 57 s for a full calibration, since the
phases other than the layer sweeps dominate) and a prediction that exists only after the runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.profile_merge import merge_profile_files
from validator.bracket import settings_of
from validator.calibrate import calibrate, disturbance

SLICE_LAYER_PASSES = 1
"""Layer sweeps per slice: one (the calibration before the runs keeps its own, default 3)."""


class CalibrationSlices:
    """`after_round(i)` (pass it to `validator.validate.validate`) calibrates a slice after every
    `every_rounds`-th round into `folder`; `pooled()` writes and returns the profile pooling the
    calibration before the runs (`base_profile`) with the slices."""

    def __init__(self, base_profile: Path, workload, model_params: dict, every_rounds: int, folder: Path,
                 say: Callable[[str], None] | None = None):
        if every_rounds < 1:
            raise ScenarioError(f"interleave: every {every_rounds} rounds; must be at least 1")
        self.base_profile = Path(base_profile)
        self.workload = workload
        self.model_params = dict(model_params)
        self.every_rounds = every_rounds
        self.folder = Path(folder)
        self.say = say
        self.slices: list[Path] = []
        self.disturbed: list[str] = []
        try:
            base = json.loads(self.base_profile.read_text())
            device, world_size, optimizer = base["device"]["kind"], base["world_size"], base["optimizer"]["name"]
            backend = base["backend"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ScenarioError(f"{self.base_profile}: not a readable calibration profile to slice ({error})") from None
        self._calibration = {"device": device, "backend": backend, "world_size": world_size, "optimizer": optimizer,
                             **settings_of(base), "layer_passes": SLICE_LAYER_PASSES}

    def after_round(self, round_index: int) -> None:
        """Calibrates a slice when `round_index` (0-based) closes a block of `every_rounds` rounds."""
        if (round_index + 1) % self.every_rounds:
            return
        path = self.folder / f"{self.base_profile.stem}_slice{len(self.slices) + 1}.json"
        if self.say:
            self.say(f"calibration slice {len(self.slices) + 1} after round {round_index + 1}")
        document = calibrate(self.workload, self.model_params, path, verbose=False, **self._calibration)
        problem = disturbance(document)
        if problem:
            self.disturbed.append(f"{path.name}: {problem}")
        self.slices.append(path)

    def pooled(self) -> Path:
        """The calibration before the runs pooled with every slice so far, written beside the slices."""
        if not self.slices:
            raise ScenarioError(f"interleave: no slice was calibrated (every {self.every_rounds} rounds; "
                                f"launch at least that many rounds)")
        pooled = self.folder / f"{self.base_profile.stem}_interleaved.json"
        merge_profile_files([self.base_profile, *self.slices], pooled)
        return pooled
