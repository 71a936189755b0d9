"""`ghpsim merge-profiles A.json B.json [...] --out POOLED.json`: pool calibrations of one model on
one machine, taken at different times, into one profile.

A calibration samples the machine's speed over one stretch of time; calibrating several times
(for instance before and after the runs to be predicted, as instruments are calibrated with
standards before and after a batch of samples) and pooling cancels a drift linear in time.

Rule: every profile must be a valid `ghpsim-profile/2` of the same model, device, backend, world
size and optimizer (anything else is an error naming the field and both values). Every number is
the arithmetic mean over the profiles: for least-squares lines over the same sizes, the mean of
the fits is the fit of the mean medians. `provenance` keeps the first profile's, plus
`merged_from` (each part's file name).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from simulator.errors import ScenarioError
from simulator.limits import check_structure
from simulator.output import check_output_file, write_text_atomic
from simulator.profile import load_profile, profile_document, profile_from_dict

MUST_MATCH = ("backend", "world_size", "device", "model", "optimizer.name")
"""Fields that identify what was calibrated: profiles differing in one of them cannot be pooled."""


def merge_profiles(documents: list[dict], names: list[str]) -> dict:
    """One profile document pooling `documents` (v2, validated); `names` name them in errors."""
    if len(documents) < 2:
        raise ScenarioError(f"profiles: {len(documents)} given; pooling needs at least two")
    for path in MUST_MATCH:
        values = [_lookup(document, path) for document in documents]
        for name, value in zip(names[1:], values[1:]):
            if value != values[0]:
                raise ScenarioError(f"{name}: {path}: {str(value)[:80]} differs from {names[0]}'s "
                                    f"{str(values[0])[:80]}; only calibrations of the same model, machine "
                                    "and world size can be pooled")
    bodies = [{key: value for key, value in document.items() if key != "provenance"} for document in documents]
    merged = _mean(bodies, "", names)
    merged["provenance"] = {**documents[0].get("provenance", {}), "merged_from": list(names)}
    return merged


def _lookup(document: dict, path: str) -> Any:
    node: Any = document
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _mean(values: list, path: str, names: list[str]) -> Any:
    first = values[0]
    if isinstance(first, dict):
        keys = set().union(*(value.keys() for value in values))
        for name, value in zip(names, values):
            if set(value) != keys:
                missing = sorted(keys - set(value))[:3]
                raise ScenarioError(f"{name}: {path or 'profile'}: lacks {', '.join(map(str, missing))} "
                                    "that another profile has")
        return {key: _mean([value[key] for value in values], f"{path}.{key}".strip("."), names) for key in first}
    if isinstance(first, list):
        if any(len(value) != len(first) for value in values):
            raise ScenarioError(f"{path}: lists of different lengths cannot be pooled")
        return [_mean([value[i] for value in values], f"{path}[{i}]", names) for i in range(len(first))]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        mean = sum(values) / len(values)
        return round(mean) if isinstance(first, int) else mean
    return first


def merge_profile_files(paths: list[str | Path], out: str | Path) -> dict:
    """Reads the profiles at `paths`, writes their pooled profile to `out` (atomically), returns it."""
    documents = [profile_document(load_profile(path)) for path in paths]
    names = [str(path) for path in paths]
    merged = profile_document(profile_from_dict(merge_profiles(documents, names), str(out)))
    check_structure(merged, f"{out} (pooled)")  # finite and within bounds, before anything is written
    write_text_atomic(out, json.dumps(merged, indent=1, allow_nan=False) + "\n")
    return merged


def run(args) -> int:
    if len(args.profiles) < 2:
        raise ScenarioError(f"profiles: {len(args.profiles)} given; pooling needs at least two")
    seen: dict[str, str] = {}
    for given in args.profiles:  # the same calibration twice would count its samples twice
        real = os.path.realpath(given)
        if real in seen:
            raise ScenarioError(f"profiles: {given} is the same file as {seen[real]}; each calibration counts once")
        seen[real] = given
    check_output_file(args.out, "--out")
    merge_profile_files(args.profiles, args.out)
    if args.json:
        print(json.dumps({"out": str(args.out), "profiles": list(args.profiles)}))
    else:
        print(f"pooled {len(args.profiles)} calibrations into {args.out}")
    return 0
