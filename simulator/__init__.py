"""ghpsim's simulator: predict the step time of distributed DNN training on a GPU cluster.

    from simulator import load_scenario, simulate
    result = simulate(load_scenario("scenarios/demo.yaml"))
    print(result.summary["step_time_s"])
"""

from simulator.errors import ScenarioError, SimulationError
from simulator.scenario import Scenario, load_scenario
from simulator.simulate import SimulationResult, simulate

__all__ = ["Scenario", "ScenarioError", "SimulationError", "SimulationResult", "load_scenario", "simulate"]
__version__ = "0.1.0"
