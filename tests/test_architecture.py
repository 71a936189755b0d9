"""The dependency rules of DESIGN.md, checked on the source: no import circles (a lazy import inside a
function is still a dependency), the simulator imports neither the validator, the command line nor
torch, simpy is the engine's alone, and the command line never imports torch itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("simulator", "validator", "ghpsim")
MAX_CYCLES_SHOWN = 30


@dataclass(frozen=True)
class Import:
    target: str
    """The imported module: one of ours (`simulator.topology`) or a third party's top name (`torch`)."""
    line: int


@lru_cache(maxsize=1)
def module_files() -> dict[str, Path]:
    """Dotted module name -> file; a package is its `__init__.py` (`simulator`)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@lru_cache(maxsize=1)
def parsed() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in module_files().items()}


def lazy_exports(tree: ast.Module) -> dict[str, tuple[str, int, str]]:
    """Names a package's `__init__` imports inside a function (its lazy `__getattr__`): name ->
    (module, level). `from package import name` depends on that module alone."""
    exports = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom):
                    for alias in node.names:
                        exports[alias.name] = (node.module or "", node.level)
    return exports


def absolute(module: str, level: int, importer: str) -> str:
    """`from ..a import b` in `importer` -> the absolute name of `..a`."""
    if not level:
        return module
    is_package = module_files()[importer].name == "__init__.py"
    base = importer.split(".")[: len(importer.split(".")) - level + (1 if is_package else 0)]
    return ".".join(base + ([module] if module else []))


def resolve(name: str) -> str:
    """The longest prefix of a dotted name that is one of our modules, else its top name."""
    modules = module_files()
    probe = name
    while probe and probe not in modules:
        probe = probe.rpartition(".")[0]
    return probe or name.partition(".")[0]


def resolve_from(module: str, name: str, seen: frozenset = frozenset()) -> str:
    """`from module import name`: the submodule `module.name` when there is one; else, when `module`
    is a package whose `__init__` imports `name` lazily, the module that name comes from; else `module`."""
    modules = module_files()
    if f"{module}.{name}" in modules:
        return f"{module}.{name}"
    home = resolve(module)
    if home in modules and modules[home].name == "__init__.py" and (home, name) not in seen:
        export = lazy_exports(parsed()[home]).get(name)
        if export is not None:
            return resolve_from(absolute(*export, home), name, seen | {(home, name)})
    return home


def imports_of(name: str) -> list[Import]:
    """Every import statement of a module, at module level or inside functions."""
    found = []
    for node in ast.walk(parsed()[name]):
        if isinstance(node, ast.Import):
            found += [Import(resolve(alias.name), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node.module or "", node.level, name)
            found += [Import(resolve_from(module, alias.name), node.lineno) for alias in node.names]
    return found


@lru_cache(maxsize=1)
def import_graph() -> nx.DiGraph:
    """Our modules and the third-party top names they import; an edge (a, b) has the lines of a."""
    graph = nx.DiGraph()
    for name in module_files():
        graph.add_node(name)
        for found in imports_of(name):
            if found.target != name:
                lines = graph.edges[name, found.target]["lines"] if graph.has_edge(name, found.target) else []
                graph.add_edge(name, found.target, lines=lines + [found.line])
    return graph


def ours(*packages: str) -> list[str]:
    return [name for name in module_files() if name.partition(".")[0] in packages]


def shortest_cycles(graph: nx.DiGraph) -> list[list[str]]:
    """One shortest cycle through each node that is on a cycle, without rotations of one another."""
    cycles = {}
    for component in nx.strongly_connected_components(graph):
        if len(component) < 2:
            continue
        sub = graph.subgraph(component)
        for node in sorted(component):
            back = min((nx.shortest_path(sub, after, node) for after in sub.successors(node)), key=len)
            cycle = [node, *back[:-1]]
            start = cycle.index(min(cycle))
            cycles[tuple(cycle[start:] + cycle[:start])] = None
    return sorted((list(cycle) for cycle in cycles), key=lambda cycle: (len(cycle), cycle))


def cycle_text(graph: nx.DiGraph, cycle: list[str]) -> str:
    steps = zip(cycle, cycle[1:] + cycle[:1])
    return " -> ".join(f"{a} (line {graph.edges[a, b]['lines'][0]})" for a, b in steps) + f" -> {cycle[0]}"


def assert_no_cycle(packages: tuple[str, ...]) -> None:
    graph = import_graph()
    cycles = shortest_cycles(graph.subgraph(ours(*packages)))
    shown = "\n".join(cycle_text(graph, cycle) for cycle in cycles[:MAX_CYCLES_SHOWN])
    assert not cycles, f"{len(cycles)} import cycle(s) among {', '.join(packages)}:\n{shown}"


def importers(packages: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    """`module:line -> target` for each import of a target top name by a module of the packages."""
    graph = import_graph()
    return [f"{name}:{line} -> {target}" for name in ours(*packages) for target in graph.successors(name)
            if target.partition(".")[0] in targets for line in graph.edges[name, target]["lines"]]


# ----------------------------------------------------------------------------- the checker itself

def test_the_graph_sees_lazy_imports_and_resolves_submodules():
    graph = import_graph()
    assert graph.has_edge("simulator.engine", "simpy")
    assert graph.has_edge("ghpsim.simulation_commands", "simulator.simulate")
    assert graph.has_edge("ghpsim.simulation_commands", "simulator.memory_plot")  # imported inside a function
    assert graph.has_edge("simulator.simulate", "simulator.fabrics")


def test_from_the_simulator_package_resolves_to_the_module_of_the_name():
    assert resolve_from("simulator", "load_scenario") == "simulator.scenario"
    assert resolve_from("simulator", "simulate") == "simulator.simulate"
    assert resolve_from("simulator", "SimulationError") == "simulator.errors"
    assert resolve_from("simulator", "topology") == "simulator.topology"


def test_cycles_are_reported_as_arrows():
    graph = nx.DiGraph()
    graph.add_edges_from([("a", "b"), ("b", "a"), ("b", "c")], lines=[1])
    assert shortest_cycles(graph) == [["a", "b"]]
    assert cycle_text(graph, ["a", "b"]) == "a (line 1) -> b (line 1) -> a"


# ----------------------------------------------------------------------------- the rules

def test_simulator_and_ghpsim_have_no_import_cycle():
    assert_no_cycle(("simulator", "ghpsim"))


def test_validator_has_no_import_cycle():
    assert_no_cycle(("validator",))


def test_the_simulator_imports_no_validator_ghpsim_or_torch():
    assert importers(("simulator",), ("validator", "ghpsim", "torch")) == []


def test_only_the_engine_imports_simpy():
    assert importers(PACKAGES, ("simpy",)) == [f"simulator.engine:{line} -> simpy"
                                               for line in import_graph().edges["simulator.engine", "simpy"]["lines"]]


def test_ghpsim_imports_no_torch():
    assert importers(("ghpsim",), ("torch",)) == []


def test_importing_a_simulator_module_does_not_run_the_simulation_pipeline():
    script = ("import sys, simulator.topology\n"
              "assert 'simulator.simulate' not in sys.modules, 'simulator/__init__ imported simulate'\n"
              "import simulator.simulate  # binds the package's attribute `simulate` to the submodule\n"
              "from simulator import load_scenario, simulate, Scenario, SimulationResult, ScenarioError, "
              "SimulationError\n"
              "assert callable(simulate) and simulate.__module__ == 'simulator.simulate'\n"
              "assert simulator.simulate is simulate and load_scenario.__module__ == 'simulator.scenario'\n"
              "assert sorted(simulator.__all__) == sorted(['Scenario', 'ScenarioError', 'SimulationError', "
              "'SimulationResult', 'load_scenario', 'simulate'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
