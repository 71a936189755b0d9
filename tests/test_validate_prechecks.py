"""Settings the validator cannot run or price from a calibration profile are refused before any rank
starts (validator/validate.py): SpecTrain without momentum (its ranks predict weights from the
momentum buffer), and a parameter server or a chosen collective algorithm (the profile timed the
backend's own allreduce)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from simulator.errors import ScenarioError  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from validator.measure import RunOptions  # noqa: E402
from validator.validate import predictions  # noqa: E402

SCENARIO = "scenarios/validation/mlp_cpu.yaml"
PROFILE = "reports/profiles/mlp_cpu_ws2.json"


def test_spectrain_without_momentum_is_refused_before_any_rank_starts():
    scenario = load_scenario(SCENARIO)
    with pytest.raises(ScenarioError, match="spectrain predicts weights from the momentum buffer; its ranks need 'momentum', got 'sgd'"):
        predictions(scenario, PROFILE, [("spectrain:4", None)], RunOptions(optimizer="sgd"))
    assert predictions(scenario, PROFILE, [("1f1b:4", None)], RunOptions(optimizer="sgd"))  # the others run


@pytest.mark.parametrize("setting", ["strategy.dp_sync=parameter_server", "strategy.collective=ring"])
def test_collectives_the_profile_did_not_time_are_refused(setting):
    with pytest.raises(ScenarioError, match="cannot be priced from the calibration profile"):
        predictions(load_scenario(SCENARIO, [setting]), PROFILE, [("dp", None)], RunOptions(optimizer="sgd"))
