"""`ghpsim merge-profiles A.json B.json [...] --out POOLED.json`: pool calibrations of one model on
one machine, taken at different times, into one profile.

A calibration samples the machine's speed over one stretch of time; calibrating several times
(for instance before and after the runs to be predicted, as instruments are calibrated with
standards before and after a batch of samples) and pooling cancels a drift linear in time.

Rule: every profile must be a valid `ghpsim-profile/2` of the same model, device, backend, world
size and optimizer (anything else is an error naming the field and both values). Every number is
the arithmetic mean over the profiles: for least-squares lines over the same sizes, the mean of
the fits is the fit of the mean medians. `provenance` keeps the first profile's, plus
`merged_from` (each part's file name) and `calibrations` (one fingerprint per calibration pooled:
`fingerprint`).

Each calibration counts once. A pooled profile given again is pooled by the calibrations it holds
(its `provenance.calibrations`): pooling a pool of three with a fourth calibration weighs each of
the four 1/4, as pooling the four files would. (A pool written before `calibrations` was recorded
counts as its `merged_from` files.)

Refused before anything is written: a kernel profile (`"kind": "kernel"`, from `ghpsim fit` or
`calibrate --kernels`: fitted parameters of an architecture, not a model's measurements), one
calibration given twice (the same file, the same measurements, or a calibration that a pooled
input already holds: `check_distinct`), and an --out that is one of the inputs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from simulator.errors import ScenarioError
from simulator.limits import check_structure
from simulator.output import check_output_file, same_file, write_text_atomic
from simulator.profile import load_profile, profile_document, profile_from_dict

MUST_MATCH = ("backend", "world_size", "device", "model", "optimizer.name")
"""Fields that identify what was calibrated: profiles differing in one of them cannot be pooled."""
CALIBRATIONS = "calibrations"
"""The provenance key of a pooled profile: the fingerprints of the calibrations it pools."""


def merge_profiles(documents: list[dict], names: list[str]) -> dict:
    """One profile document pooling `documents` (v2, validated); `names` name them in errors."""
    if len(documents) < 2:
        raise ScenarioError(f"profiles: {len(documents)} given; pooling needs at least two")
    check_kinds(documents, names)
    for path in MUST_MATCH:
        values = [_lookup(document, path) for document in documents]
        for name, value in zip(names[1:], values[1:]):
            if value != values[0]:
                where, ours, theirs = _first_difference(value, values[0], path)
                raise ScenarioError(f"{name}: {where}: {ours} differs from {names[0]}'s {theirs}; only "
                                    "calibrations of the same model, machine and world size can be pooled")
    bodies = [_body(document) for document in documents]
    held = [calibrations(document) for document in documents]
    merged = _mean(bodies, "", names, [len(ids) for ids in held])
    merged["provenance"] = {**documents[0].get("provenance", {}), "merged_from": list(names),
                            CALIBRATIONS: [fingerprint for ids in held for fingerprint in ids]}
    return merged


def fingerprint(document: dict) -> str:
    """A calibration's fingerprint: the SHA-256 of its measurements (the document less `provenance`,
    keys sorted), so a copy, a re-saved file or one with edited provenance has the same one."""
    text = json.dumps(_body(document), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def calibrations(document: dict) -> list[str]:
    """The fingerprints of the calibrations `document` holds: a pooled profile's recorded ones, one
    per file of an older pool's `merged_from` (their fingerprints unknown), else its own."""
    provenance = document.get("provenance") or {}
    recorded, parts = provenance.get(CALIBRATIONS), provenance.get("merged_from")
    if isinstance(recorded, list) and recorded and all(isinstance(item, str) for item in recorded):
        return list(recorded)
    if isinstance(parts, list) and parts:
        return [f"{fingerprint(document)}/{index}" for index in range(len(parts))]
    return [fingerprint(document)]


def _body(document: dict) -> dict:
    return {key: value for key, value in document.items() if key != "provenance"}


def check_kinds(documents: list[dict], names: list[str]) -> None:
    """ScenarioError naming the first kernel profile: pooling averages a model's measured layer and
    communication fits, which a kernel profile (fitted parameters of a GPU architecture) lacks."""
    for name, document in zip(names, documents):
        if document.get("kind") == "kernel":
            raise ScenarioError(f"{name}: a kernel profile (\"kind\": \"kernel\", architecture "
                                f"{_short(document.get('architecture'))}); merge-profiles pools calibration "
                                "profiles of one model from `ghpsim calibrate`, not kernel profiles")


def check_distinct(documents: list[dict], names: list[str]) -> None:
    """ScenarioError naming both files when two profiles hold one calibration. Rule: two profiles
    are one calibration when their documents are equal once `provenance` is set aside (`fingerprint`).
    Two calibrations never time every layer and message to the same 15 digits, while a copy, a
    re-saved or re-indented file, or one whose provenance was edited, is the same measurement;
    pooling it would count its samples twice. A pooled profile holds each calibration it pooled
    (`calibrations`; an older pool's `merged_from` files are compared by path)."""
    held = [set(calibrations(document)) for document in documents]
    for index, name in enumerate(names):
        for earlier in range(index):
            pooled = (_is_pool(documents[earlier]), _is_pool(documents[index]))
            if held[earlier] & held[index] or _in_older_pool(documents[index], names[earlier]) \
                    or _in_older_pool(documents[earlier], name):
                why = {(False, False): "identical measurements", (True, False): "which pools it",
                       (False, True): "which it pools", (True, True): "both pools hold it"}[pooled]
                raise ScenarioError(f"profiles: {name} holds the same calibration as {names[earlier]} ({why}); "
                                    "each calibration counts once")


def _is_pool(document: dict) -> bool:
    return bool((document.get("provenance") or {}).get("merged_from"))


def _in_older_pool(document: dict, path: str) -> bool:
    """Whether `document` is a pool without recorded fingerprints whose `merged_from` names `path`."""
    provenance = document.get("provenance") or {}
    if provenance.get(CALIBRATIONS) or not isinstance(provenance.get("merged_from"), list):
        return False
    return any(isinstance(part, str) and same_file(part, path) for part in provenance["merged_from"])


def _first_difference(value: Any, other: Any, path: str) -> tuple[str, str, str]:
    """(the dotted path of the first key where `value` and `other` differ, both values shortened)."""
    if isinstance(value, dict) and isinstance(other, dict):
        for key in list(value) + [key for key in other if key not in value]:
            if key not in value or key not in other:
                return (f"{path}.{key}", _short(value[key]) if key in value else "(absent)",
                        _short(other[key]) if key in other else "(absent)")
            if value[key] != other[key]:
                return _first_difference(value[key], other[key], f"{path}.{key}")
    if isinstance(value, list) and isinstance(other, list):
        if len(value) != len(other):
            return path, f"{len(value)} items", f"{len(other)} items"
        for index, (item, other_item) in enumerate(zip(value, other)):
            if item != other_item:
                return _first_difference(item, other_item, f"{path}[{index}]")
    return path, _short(value), _short(other)


def _short(value: Any) -> str:
    """`value` in at most 40 characters (a nested value is summarised, never cut mid-way)."""
    if isinstance(value, dict):
        return f"{{{len(value)} keys}}"
    if isinstance(value, list):
        return f"[{len(value)} items]"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _lookup(document: dict, path: str) -> Any:
    node: Any = document
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _mean(values: list, path: str, names: list[str], weights: list[int]) -> Any:
    """The weighted mean of `values` (each profile weighs the number of calibrations it holds)."""
    first = values[0]
    if isinstance(first, dict):
        keys = set().union(*(value.keys() for value in values))
        for name, value in zip(names, values):
            if set(value) != keys:
                missing = sorted(keys - set(value))[:3]
                raise ScenarioError(f"{name}: {path or 'profile'}: lacks {', '.join(map(str, missing))} "
                                    "that another profile has")
        return {key: _mean([value[key] for value in values], f"{path}.{key}".strip("."), names, weights)
                for key in first}
    if isinstance(first, list):
        if any(len(value) != len(first) for value in values):
            raise ScenarioError(f"{path}: lists of different lengths cannot be pooled")
        return [_mean([value[i] for value in values], f"{path}[{i}]", names, weights) for i in range(len(first))]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        mean = sum(weight * value for weight, value in zip(weights, values)) / sum(weights)
        return round(mean) if isinstance(first, int) else mean
    return first


def merge_profile_files(paths: list[str | Path], out: str | Path) -> dict:
    """Reads the profiles at `paths`, writes their pooled profile to `out` (atomically), returns it."""
    documents = [profile_document(load_profile(path)) for path in paths]
    names = [str(path) for path in paths]
    check_kinds(documents, names)
    check_distinct(documents, names)
    merged = profile_document(profile_from_dict(merge_profiles(documents, names), str(out)))
    check_structure(merged, f"{out} (pooled)")  # finite and within bounds, before anything is written
    write_text_atomic(out, json.dumps(merged, indent=1, allow_nan=False) + "\n")
    return merged


def run(args) -> int:
    if len(args.profiles) < 2:
        raise ScenarioError(f"profiles: {len(args.profiles)} given; pooling needs at least two")
    for index, given in enumerate(args.profiles):  # the same calibration twice would count its samples twice
        for earlier in args.profiles[:index]:
            if same_file(given, earlier):
                raise ScenarioError(f"profiles: {given} is the same file as {earlier}; each calibration counts once")
    check_output_file(args.out, "--out")
    for given in args.profiles:
        if same_file(args.out, given):
            raise ScenarioError(f"--out {args.out}: the same file as the input profile {given}; "
                                "it would be overwritten")
    merged = merge_profile_files(args.profiles, args.out)
    count = len(merged["provenance"][CALIBRATIONS])
    if args.json:
        print(json.dumps({"out": str(args.out), "profiles": list(args.profiles), "calibrations": count}))
    else:
        parts = f" (from {len(args.profiles)} profiles)" if count != len(args.profiles) else ""
        print(f"pooled {count} calibrations{parts} into {args.out}")
    return 0
