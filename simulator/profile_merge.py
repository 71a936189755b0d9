"""`ghpsim merge-profiles A.json B.json [...] --out POOLED.json`: pool calibrations of one model on
one machine, taken at different times, into one profile.

Why: on a shared host the machine's speed wanders over minutes (this project's 2-core VM: slow
spells of 0.1-2 s whose share of a 10-second window moves from 0.03 to 0.90 within two minutes),
so one calibration samples one stretch of it. Calibrating before *and* after the runs to be
predicted ("bracketing", as instruments are calibrated with standards before and after a batch of
samples) cancels a drift that is linear in time and halves the variance of a level that is not.
Only microbenchmarks enter: the pooled profile is as held-out from the plan runs as its parts.

Pooling rule, field by field (all profiles must be `ghpsim-profile/1` of the same model, device,
backend and world size; anything else is an error naming the field and both values):
- numbers: the arithmetic mean over the profiles that have the field (equal values are kept as they
  are; integers, i.e. counts, stay integers: their mean rounded). A fitted line's coefficients are
  averaged too: for least squares over the same sizes, the mean of the fits is the fit of the mean
  medians.
- lists of numbers: element by element (their lengths must agree: same sizes, same layers).
- `pass_jitter.levels` and `pass_jitter.start_offsets_s`: rows of measured passes, i.e. samples,
  so they are pooled, not averaged: each profile's first half of rows, then each one's second half,
  which keeps `PassJitter.exit_draws`' pairing of a row with the row half the rows further on
  inside one calibration.
- `method` (how a calibration measured, not a figure): kept when every profile's is the same;
  otherwise the pooled profile's `method` lists each part's under `parts` (calibrations with
  different sweep counts, e.g. `validator.interleave`'s one-sweep slices, pool their figures).
- `notes`: concatenated; other strings: the first profile's; `created_utc`: the first's, and the
  pooled profile records `merged_from` (each part's `created_utc`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator.errors import ScenarioError
from simulator.output import check_output_file, write_json_atomic
from simulator.profile import FORMAT as PROFILE_FORMAT_ID

COMMAND = "merge-profiles"
MUST_MATCH = ("format", "backend", "world_size", "device.kind", "device.name", "device.num_threads", "model.name",
              "model.params", "model.num_layers", "optimizer.name")
"""Fields that identify what was calibrated: profiles differing in one of them cannot be pooled."""
SAMPLE_ROWS = ("pass_jitter.levels", "pass_jitter.start_offsets_s")


def merge_profiles(profiles: list[dict], names: list[str] | None = None) -> dict:
    """One profile pooling `profiles` (module docstring). `names` (one per profile) name them in errors."""
    if not profiles:
        raise ScenarioError("merge-profiles: no profiles to pool")
    names = names or [f"profile {i + 1}" for i in range(len(profiles))]
    for path in MUST_MATCH:
        values = [_lookup(profile, path) for profile in profiles]
        for name, value in zip(names[1:], values[1:]):
            if value != values[0]:
                raise ScenarioError(f"{name}: {path}: {value!r} differs from {names[0]}'s {values[0]!r}; "
                                    f"only calibrations of the same model, machine and world size can be pooled")
    methods = [profile.get("method") for profile in profiles]
    merged = _merge([{key: value for key, value in profile.items() if key != "method"} for profile in profiles],
                    "", names)
    if any(method is not None for method in methods):
        merged["method"] = (methods[0] if all(method == methods[0] for method in methods) else
                            {"pooled": "the mean of the parts' figures (simulator.profile_merge)", "parts": methods})
    merged["merged_from"] = [profile.get("created_utc", "unknown") for profile in profiles]
    return merged


def _lookup(document: dict, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


def _merge(values: list, path: str, names: list[str]) -> Any:
    first = values[0]
    if path in SAMPLE_ROWS:
        return {level: _pooled_rows([value[level] for value in values if level in value])
                for level in _keys(values)}
    if all(value == first for value in values):
        return first
    if all(isinstance(value, dict) for value in values):
        merged = {}
        for key in _keys(values):
            having = [i for i, value in enumerate(values) if key in value]
            merged[key] = _merge([values[i][key] for i in having], f"{path}.{key}".lstrip("."),
                                 [names[i] for i in having])
        return merged
    if path == "notes":
        return [note for value in values for note in (value or [])]
    if all(isinstance(value, list) for value in values):
        lengths = {len(value) for value in values}
        if len(lengths) > 1:
            raise ScenarioError(f"{names[1]}: {path}: {len(values[1])} entries, {names[0]} has {len(first)}; "
                                f"pooled profiles must measure the same sizes and layers")
        return [_merge(list(column), f"{path}[]", names) for column in zip(*values)]
    if all(_is_number(value) and not isinstance(value, float) for value in values):  # counts: stay integers
        return round(sum(values) / len(values))
    if all(_is_number(value) for value in values):
        return sum(values) / len(values)
    if all(isinstance(value, str) for value in values):
        return first
    if all(value is None or _is_number(value) for value in values):  # e.g. a fit that one calibration lacked
        numbers = [value for value in values if value is not None]
        return sum(numbers) / len(numbers)
    raise ScenarioError(f"{names[1]}: {path}: {values[1]!r} cannot be pooled with {names[0]}'s {first!r}")


def _keys(values: list[dict]) -> list:
    keys = []
    for value in values:
        keys += [key for key in value if key not in keys]
    return keys


def _pooled_rows(parts: list[list]) -> list:
    """Each part's first half of rows, then each part's second half (module docstring)."""
    halves = [len(rows) // 2 for rows in parts]
    return ([row for rows, half in zip(parts, halves) for row in rows[:half]]
            + [row for rows, half in zip(parts, halves) for row in rows[half:]])


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def merge_profile_files(paths: list[str | Path], out: str | Path) -> dict:
    """Reads the profiles at `paths`, writes their pooled profile to `out` (atomically), returns it."""
    profiles = []
    for path in paths:
        try:
            profile = json.loads(Path(path).read_text())
        except json.JSONDecodeError as error:
            raise ScenarioError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
        if not isinstance(profile, dict) or profile.get("format") != PROFILE_FORMAT_ID:
            found = profile.get("format") if isinstance(profile, dict) else type(profile).__name__
            raise ScenarioError(f"{path}: format: {found!r} is not {PROFILE_FORMAT_ID!r}")
        profiles.append(profile)
    merged = merge_profiles(profiles, [str(path) for path in paths])
    write_json_atomic(out, merged)
    return merged


def add_parser(commands) -> None:
    parser = commands.add_parser(COMMAND, help="pool calibrations taken at different times into one profile")
    parser.add_argument("profiles", nargs="+", metavar="PROFILE", help="profiles from `ghpsim calibrate`")
    parser.add_argument("--out", required=True, metavar="FILE", help="where to write the pooled profile")


def run(args) -> int:
    if len(args.profiles) < 2:
        raise ScenarioError(f"profiles: {len(args.profiles)} given; pooling needs at least two")
    check_output_file(args.out, "--out")
    merge_profile_files(args.profiles, args.out)
    print(f"pooled {len(args.profiles)} calibrations into {args.out}")
    return 0
