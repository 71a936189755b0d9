"""ghpsim's simulator: predict the step time of distributed DNN training on a GPU cluster.

    from simulator import load_scenario, simulate
    result = simulate(load_scenario("scenarios/demo.yaml"))
    print(result.summary["step_time_s"])

The public names are imported on first use, so that importing one module (`simulator.topology`)
does not import the whole simulation pipeline.
"""

import sys
import types

__all__ = ["Scenario", "ScenarioError", "SimulationError", "SimulationResult", "load_scenario", "simulate"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Scenario":
        from simulator.scenario import Scenario as value
    elif name == "load_scenario":
        from simulator.scenario import load_scenario as value
    elif name == "SimulationResult":
        from simulator.simulate import SimulationResult as value
    elif name == "ScenarioError":
        from simulator.errors import ScenarioError as value
    elif name == "SimulationError":
        from simulator.errors import SimulationError as value
    else:
        raise AttributeError(f"module 'simulator' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """`simulate` is both the function and a submodule. Importing the submodule sets the package's
    attribute to the module; this property keeps it the function, as an eager import would."""

    @property
    def simulate(self):
        from simulator.simulate import simulate
        return simulate

    @simulate.setter
    def simulate(self, submodule) -> None:
        pass  # the import system binding `simulator.simulate`: the attribute stays the function


sys.modules[__name__].__class__ = _Package
