"""`ghpsim schedule KIND --stages M --microbatches m [--virtual-stages V] [--json]`: print a
pipeline schedule as a grid (rows = ranks, columns = unit time slots), after checking it."""

from __future__ import annotations

import json

from simulator.errors import ScenarioError
from simulator.schedules import build_schedule
from simulator.schedules.grid import render_grid, schedule_document

MAX_ACTIONS = 100_000
"""At most this many F and B actions (2 p m v): the check and the grid stay within a few seconds."""
MAX_CELLS = 2_000_000
"""At most this many grid cells, ranks x slots (about p x 2 (m v + p))."""
SCENARIO_FIELD_OPTIONS = {"strategy.num_microbatches": "--microbatches", "strategy.num_virtual_stages": "--virtual-stages",
                          "strategy.num_groups": "--stages", "strategy.pp_degree": "--stages"}
"""The scenario fields the schedule checks name, and the flags that set them here."""


def run(args) -> int:
    for option, value in (("--stages", args.stages), ("--microbatches", args.microbatches),
                          ("--virtual-stages", args.virtual_stages)):
        if value is not None and value < 1:
            raise ScenarioError(f"{option}: {value} must be at least 1")
    if args.no_stash and args.kind != "pipedream":
        raise ScenarioError(f"--no-stash: applies to pipedream (weight stashing), not {args.kind}")
    if args.weight_prediction is not None and args.kind != "spectrain":
        raise ScenarioError(f"--weight-prediction {args.weight_prediction}: applies to spectrain, not {args.kind}")
    if args.kind == "interleaved_1f1b" and args.stages < 2:  # as a scenario refuses it (strategies.pipeline)
        raise ScenarioError(f"--stages {args.stages}: interleaved_1f1b needs at least 2 stages")
    virtual = args.virtual_stages or (2 if args.kind == "interleaved_1f1b" else 1)
    check_size(args.stages, args.microbatches, virtual)
    try:
        schedule = build_schedule(args.kind, args.stages, args.microbatches, virtual,
                                  args.weight_prediction in (None, "staggered"))
    except ScenarioError as error:  # the schedule's checks speak of scenario fields: name this command's flags
        message = str(error)
        for field, option in SCENARIO_FIELD_OPTIONS.items():
            message = message.replace(field, option)
        raise ScenarioError(message) from None
    if args.json:
        print(json.dumps(schedule_document(schedule, weight_stashing=not args.no_stash)))
    else:
        print(render_grid(schedule), end="")
    return 0


def check_size(stages: int, microbatches: int, virtual: int) -> None:
    """ScenarioError when the schedule would be too large to check and print in a few seconds."""
    actions = 2 * stages * microbatches * virtual
    cells = stages * 2 * (microbatches * virtual + stages)
    if actions > MAX_ACTIONS or cells > MAX_CELLS:
        raise ScenarioError(f"--stages {stages} x --microbatches {microbatches} x --virtual-stages {virtual}: "
                            f"too large ({actions:,} F/B actions, ~{cells:,} grid cells; at most "
                            f"{MAX_ACTIONS:,} actions and {MAX_CELLS:,} cells)")
