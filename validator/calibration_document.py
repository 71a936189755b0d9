"""The calibration profile's document from the ranks' raw measurements (`validator.calibrate`):
per-layer fits over the batch sizes, the update's and the weight passes' fits over the parameter
counts, alpha-beta fits of the messages and collectives (least squares weighted by 1 / t^2, i.e.
relative errors), and the method's text. The format: `simulator.profile.PROFILE_FORMAT`."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence

import torch

from simulator.copy_backward import copy_backward_section
from simulator.errors import ScenarioError
from simulator.profile import FORMAT, profile_from_dict
from simulator.workload import Workload
from validator.cold_bench import single_pass_overheads
from validator.microbench import DEFAULT_MIN_BLOCK_S, fit_line
from validator.weight_pass_bench import WEIGHT_PASSES


def _fit_entry(xs, ys, notes: list[str], what: str, weights=None):
    fit = fit_line(xs, ys, weights)
    if fit.clamped:
        notes.append(f"{what}: {fit.clamped}")
    return fit


def _alpha_beta(sizes, medians, notes, what) -> dict:
    fit = _fit_entry(sizes, medians, notes, what, weights=[1.0 / t ** 2 for t in medians])
    bandwidth = 1.0 / fit.slope if fit.slope > 0 else math.inf
    if not math.isfinite(bandwidth):
        notes.append(f"{what}: time does not grow with size; bandwidth recorded as 1e30 B/s")
        bandwidth = 1e30
    return {"latency_s": fit.intercept, "bandwidth_bytes_per_s": bandwidth, "sizes_bytes": list(sizes),
            "medians_s": list(medians), "r2": fit.r2}


def _topk_fit(items: list[dict], notes: list[str], what: str) -> dict:
    elements = [item["num_elements"] for item in items]
    medians = [item["median_s"] for item in items]
    fit = _fit_entry(elements, medians, notes, what, weights=[1.0 / t ** 2 for t in medians])
    return {"intercept_s": fit.intercept, "per_element_s": fit.slope, "elements": elements,
            "medians_s": medians, "r2": fit.r2}


def _pass_fit(items: list[dict], key: str, notes: list[str], what: str, ranks_at_once: int | None,
              alone: list[dict] | None = None) -> dict:
    """The fit of `key` over the layer sets of `items` (`validator.weight_pass_bench`), with the
    sets' medians; where the passes were timed with several ranks at once and rank 0 alone too
    (`alone`), that timing's fit as `alone` (recorded, not played by the model)."""
    counts = [item["num_params"] for item in items]
    times = [item[key] for item in items]
    fit = _fit_entry(counts, times, notes, what)
    entry = {"intercept_s": fit.intercept, "per_param_s": fit.slope, "r2": fit.r2,
             "ranks_at_once": ranks_at_once, "num_params": counts, "medians_s": times}
    if alone:
        alone_times = [item[key] for item in alone]
        alone_fit = _fit_entry(counts, alone_times, notes, f"{what}.alone")
        entry["alone"] = {"intercept_s": alone_fit.intercept, "per_param_s": alone_fit.slope, "r2": alone_fit.r2,
                          "ranks_at_once": 1, "medians_s": alone_times}
    return entry


def _weight_pass_fits(items: list[dict], notes: list[str], ranks_at_once: int,
                      alone: list[dict] | None = None) -> dict:
    fits = {name: _pass_fit(items, f"{name}_s", notes, f"weight_passes.{name}", ranks_at_once, alone)
            for name in WEIGHT_PASSES}
    if all("stash_after_plain_s" in item for item in items):  # informational: the stash as timed before
        fits["stash"]["after_plain_medians_s"] = [item["stash_after_plain_s"] for item in items]
    return fits


def _update_in_cycle_fit(items: list[dict] | None, notes: list[str], ranks_at_once: int | None,
                         alone: list[dict] | None = None) -> dict:
    """`{"in_cycle": fit}` of the update timed at the end of the weight passes' micro-batch cycles
    (`validator.weight_pass_bench`), or {} when the calibration did not time it."""
    if not items or any("update_s" not in item for item in items):
        return {}
    return {"in_cycle": _pass_fit(items, "update_s", notes, "optimizer.in_cycle", ranks_at_once, alone)}


def build_document(workload: Workload, model_params: dict, raw: dict, *, world_size: int, device: str,
                   backend: str, batch_sizes: Sequence[int], optimizer: str, comm_sizes: Sequence[int],
                   repeats: int, comm_repeats: int, min_block_s: float = DEFAULT_MIN_BLOCK_S,
                   layer_passes: int = 1) -> dict:
    """The profile document (see `simulator.profile.PROFILE_FORMAT`) from the ranks' medians."""
    notes: list[str] = []
    by_level = raw["layers"]  # {k: [per active rank: time_layers rows]}
    totals = {k: 0.0 for k in by_level}
    level_medians = {k: {"forward": [], "backward": []} for k in by_level}  # k -> phase -> per layer
    layers = []
    for index, layer in enumerate(workload.layers):
        entry = {"index": index, "name": layer.name, "batch_sizes": list(batch_sizes)}
        for phase, key in (("forward", "forward_s"), ("backward", "backward_s")):
            means = {}
            for k, ranks in by_level.items():
                columns = zip(*(rows[index][key] for rows in ranks))
                means[k] = [sum(values) / len(values) for values in columns]
                totals[k] += sum(means[k])
                level_medians[k][phase].append(means[k])
            mean = means[world_size]
            fit = _fit_entry(batch_sizes, mean, notes, f"layers[{index}].{phase}")
            entry[phase] = {"intercept_s": fit.intercept, "per_sample_s": fit.slope}
            entry[f"r2_{phase}"] = fit.r2
            entry[f"{phase}_medians_s"] = mean
            if world_size > 1:
                entry[f"{phase}_medians_alone_s"] = means[1]
        layers.append(entry)

    compute_slowdown = {k: (totals[k] / totals[1] if totals[1] > 0 else 1.0) for k in sorted(totals)}
    cold_start = raw.get("cold_start")
    if cold_start:
        cold_start = {**cold_start, **single_pass_overheads(cold_start, level_medians, batch_sizes,
                                                            compute_slowdown, world_size)}
    counts = [item["num_params"] for item in raw["optimizer"]]
    times = [item["median_s"] for item in raw["optimizer"]]
    fit = _fit_entry(counts, times, notes, "optimizer")
    copy_backward = copy_backward_section(raw.get("weight_passes"))
    document = {
        "format": FORMAT,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": {"kind": "cuda" if device.startswith("cuda") else "cpu", "name": raw["device_name"],
                   "num_threads": raw["num_threads"]},
        "torch_version": torch.__version__,
        "backend": backend,
        "world_size": world_size,
        "model": {"name": workload.name, "params": dict(model_params), "num_layers": workload.num_layers,
                  "layer_names": [layer.name for layer in workload.layers],
                  "num_params": workload.num_params,
                  "forward_flops_per_sample": workload.forward_flops_per_sample},
        "layers": layers,
        "optimizer": {"name": optimizer, "intercept_s": fit.intercept, "per_param_s": fit.slope, "r2": fit.r2,
                      "num_params": counts, "medians_s": times,
                      **_update_in_cycle_fit(raw.get("weight_passes"), notes, raw.get("weight_pass_ranks_at_once"),
                                             raw.get("weight_passes_alone"))},
        **({"weight_passes": _weight_pass_fits(raw["weight_passes"], notes, raw["weight_pass_ranks_at_once"],
                                               raw.get("weight_passes_alone"))}
           if raw.get("weight_passes") else {}),
        **({"copy_backward": copy_backward} if copy_backward else {}),
        **({"cold_start": cold_start} if cold_start else {}),
        **({"layer_sweep": raw["layer_sweep"]} if raw.get("layer_sweep") else {}),
        "p2p": (_alpha_beta(comm_sizes, raw["p2p"], notes, "p2p") if raw["p2p"] is not None else None),
        "allreduce": {str(g): {**_alpha_beta(comm_sizes, item["medians_s"], notes, f"allreduce.{g}"),
                               "concurrent_groups": item["concurrent_groups"]}
                      for g, item in sorted(raw["allreduce"].items())},
        "compute_slowdown": {str(k): factor for k, factor in compute_slowdown.items()},
        "allgather": {str(g): {**_alpha_beta(comm_sizes, item["medians_s"], notes, f"allgather.{g}"),
                               "concurrent_groups": item["concurrent_groups"]}
                      for g, item in sorted(raw.get("allgather", {}).items())},
        "topk": {repr(float(density)): _topk_fit(items, notes, f"topk.{density}")
                 for density, items in sorted(raw.get("topk", {}).items())},
        **({"overlap": {"world_size": world_size, **raw["overlap"]}} if raw.get("overlap") else {}),
        **({"handoff": raw["handoff"]} if raw.get("handoff") else {}),
        **({"cycle_compute": raw["cycle_compute"]} if raw.get("cycle_compute") else {}),
        **({"pass_jitter": raw["pass_jitter"]} if raw.get("pass_jitter") else {}),
        "method": {
            "layers": f"per rank: median over {layer_passes} pass(es) spread over the calibration of the "
                      f"median over {repeats} blocks of back-to-back iterations (>= {min_block_s} s each) of the "
                      f"time per iteration; mean over the {world_size} ranks, all timing the same layer at once; "
                      "the last layer includes the loss",
            **({"layer_passes": raw["layer_passes"]} if raw.get("layer_passes") else {}),
            "compute_slowdown": "k ranks at once (the others waiting at barriers): sum over layers, batch sizes "
                                "and phases of the mean over the k ranks of their medians, / the same for "
                                "rank 0 alone",
            "comm": f"per size: median over {layer_passes} pass(es) spread over the calibration of the median of "
                    f"{comm_repeats} runs; alpha-beta least squares weighted by 1/t^2",
            **({"comm_passes": raw["comm_passes"]} if raw.get("comm_passes") else {}),
            "measure_s": raw["measure_s"],
        },
        "notes": notes,
    }
    return document


PLAUSIBILITY_CHECKED_SECTIONS = ("cycle_compute", "copy_backward", "stage_loops")
"""Optional measured sections whose loader refuses a ratio outside a plausible range (a rank
stalled or the clock jumped while they were timed); the simulator plays profiles without them."""


def loadable_document(document: dict, source: str) -> dict:
    """`document` as `simulator.profile.profile_from_dict` will accept it, checked before the
    calibration writes it, so that no profile the simulator refuses is written. A section of
    `PLAUSIBILITY_CHECKED_SECTIONS` the loader refuses is dropped, with a note naming the field and
    the value; any other refusal raises the loader's one-line ScenarioError."""
    while True:  # each pass returns, raises, or drops one section the document still has
        try:
            profile_from_dict(document, source)
            return document
        except ScenarioError as error:
            field_and_problem = str(error).removeprefix(f"{source}: ")
            section = getattr(error, "field", "").split(".", 1)[0].split("[", 1)[0]
            if section not in PLAUSIBILITY_CHECKED_SECTIONS or section not in document:
                raise
            del document[section]
            document.setdefault("notes", []).append(
                f"{field_and_problem}: the {section} section is left out (the simulator plays the profile without "
                "it); recalibrate on a quiet machine to time it")
