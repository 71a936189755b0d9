"""Every command's arguments, as plain argparse: one function per command, given its sub-parser.

This module imports argparse-level code only (no simulator, validator, pandas or torch), so that
`ghpsim --help` and argument errors are instant. The few names and defaults the help texts quote
are copied here from the modules that own them; tests/test_cli_home.py checks each copy against
its source.
"""

from __future__ import annotations

import argparse
import importlib.util

PIPELINE_KINDS = ("gpipe", "1f1b", "interleaved_1f1b", "pipedream", "spectrain", "delayed_gradient")
"""`simulator.scenario.PIPELINE_KINDS`; also the schedules of `simulator.schedules.SCHEDULES`."""
STRATEGIES_HELP = ("comma list of dp, mp, ghp, ghp:G (G groups), KIND or KIND:m (a pipeline kind, m micro-batches; "
                   f"KIND one of {', '.join(PIPELINE_KINDS)})")
"""The `--strategies` help text of every command that takes a strategy list."""
REPORT_KINDS_HELP = ("a scenario (.yaml), a compare/simulate result (.json), a sweep table (.csv or its folder) "
                     "or a validation table (.csv)")
"""`simulator.report.inputs.KINDS_HELP`."""
MICROBATCH_COUNTS = (2, 4, 8)
"""`simulator.planner.MICROBATCH_COUNTS` (`validate --rank`'s megatron m; `rank` searches sizes b instead)."""
MICROBATCH_SIZES = (1, 2, 4, 8)
"""`simulator.layout_search.MICROBATCH_SIZES`."""
SWEEP_STORE_NAME, SWEEP_CSV_NAME, SWEEP_PARQUET_NAME = "sweep.sqlite", "results.csv", "results.parquet"
"""`simulator.sweep.store.STORE_NAME`, `simulator.sweep.export.CSV_NAME` and `PARQUET_NAME`."""
GALLERY_ENTRIES = ("ghp", "hyparflow", "spectrain", "pase", "laysa")
GALLERY_OUT = "reports/gallery"
"""`simulator.report.gallery.ENTRIES` (its keys) and `ghpsim gallery`'s default output folder."""
CALIBRATE_REPEATS, CALIBRATE_LAYER_PASSES, CALIBRATE_BATCH_SIZES = 7, 3, (4, 16, 64)
"""`validator.calibrate.DEFAULT_REPEATS`, `validator.layer_passes.DEFAULT_LAYER_PASSES` and
`validator.calibrate.DEFAULT_BATCH_SIZES`."""
KERNEL_DTYPES = {"cuda": ("fp16", "bf16", "fp32"), "cpu": ("fp32",)}
"""`validator.kernel_bench.DEFAULT_DTYPES`."""
PROFILE_HELP = ("cost profile: a calibration from `ghpsim calibrate`, or a kernel profile from `ghpsim fit` or "
                "`ghpsim calibrate --kernels` (default: no profile; the scenario's costs.model, auto: the kernel "
                "model where the GPU has kernel tables, else the analytic roofline)")


def scenario_args(parser: argparse.ArgumentParser, scenario: bool = True) -> None:
    """SCENARIO (unless `scenario` is False), `--set KEY=VALUE` and `--json`."""
    if scenario:
        parser.add_argument("scenario", help="scenario YAML file (see scenarios/README.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario field, e.g. --set cluster.num_nodes=8 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def demo(parser: argparse.ArgumentParser) -> None:
    scenario_args(parser, scenario=False)
    parser.add_argument("--strategies", default="dp,mp,ghp", help=f"{STRATEGIES_HELP} (default dp,mp,ghp)")


def simulate(parser: argparse.ArgumentParser) -> None:
    scenario_args(parser)
    parser.add_argument("--profile", metavar="FILE", help=PROFILE_HELP)
    parser.add_argument("--trace", metavar="FILE", help="write the step's timeline as Perfetto trace JSON")
    parser.add_argument("--memory-plot", metavar="FILE.png", help="write each device's memory over the step as an "
                        "image (format from the suffix: png, svg, pdf, ...)")


def compare(parser: argparse.ArgumentParser) -> None:
    scenario_args(parser)
    parser.add_argument("--strategies", default=None, help=f"{STRATEGIES_HELP}, or megatron (the scenario's own "
                        "megatron layout, or its tp_degree x pp_degree); default dp,mp,ghp, a megatron scenario's "
                        "own layout")
    parser.add_argument("--profile", metavar="FILE", help=PROFILE_HELP)


def listing(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=("gpus", "links", "models"),
                        help="the catalogue to print: GPU presets, link presets or zoo models")
    parser.add_argument("--json", action="store_true",
                        help="print the presets as JSON: every field of each GPU or link (with its source), or the model names")


def rank(parser: argparse.ArgumentParser) -> None:
    scenario_args(parser)
    parser.add_argument("--gpus", default=None, metavar="N[,N...]",
                        help="N GPUs (default the scenario's): N / gpus_per_node nodes, or one node of N; a comma "
                             "list ranks each cluster size and compares them")
    parser.add_argument("--top", type=int, default=10, help="K: the search simulates until no other candidate can "
                        "enter the K best; they are printed (all simulated ones are in --json; default %(default)s)")
    parser.add_argument("--plot", metavar="FILE.png", help="write the ranking as a bar plot (several --gpus: time "
                        "against cost, with the Pareto front)")
    parser.add_argument("--workers", type=int, default=None, help="simulation processes (default: CPU count; at most 4 a CPU)")
    parser.add_argument("--kinds", default=None,
                        help="comma list of strategy kinds to search (default: dp, mp, ghp, gpipe, 1f1b, "
                             "interleaved_1f1b and, for models with attention layers, megatron; asynchronous "
                             "pipelines only by name)")
    parser.add_argument("--microbatches", default="auto",
                        help="micro-batch counts m per replica tried for the pipeline kinds gpipe, 1f1b, "
                             "interleaved_1f1b and the asynchronous ones (comma list; default %(default)s: the powers "
                             "of two from 2 up to max(8, 4 x the stages) that divide the group's batch); not megatron, "
                             "see --microbatch-sizes")
    parser.add_argument("--microbatch-sizes", default=",".join(map(str, MICROBATCH_SIZES)),
                        help="micro-batch sizes b tried for megatron layouts, each giving m = B / (d x b) "
                             "micro-batches for d replicas (m = 1 where b is a replica's whole batch); comma list, "
                             "default %(default)s")
    parser.add_argument("--exhaustive", action="store_true", help="simulate every candidate that may fit in memory "
                        "(no pruning by the step-time bound)")
    parser.add_argument("--profile", metavar="FILE", default=None,
                        help="a kernel profile from `ghpsim fit` (your cluster's training logs) or `ghpsim calibrate "
                             "--kernels`: every layout priced with its parameters (as --set costs.kernel_profile=FILE)")
    run_length = parser.add_mutually_exclusive_group()
    run_length.add_argument("--tokens", type=float, default=None, metavar="T",
                            help="plan a whole run of T training tokens (samples for models without a sequence)")
    run_length.add_argument("--steps", type=int, default=None, metavar="S", help="plan a whole run of S steps")
    parser.add_argument("--price-per-gpu-hour", type=float, default=None, metavar="P",
                        help="price of one GPU-hour: the run's cost per candidate")


def report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", metavar="INPUT", help=REPORT_KINDS_HELP)
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for report.html, report.md, "
                        "figures/ and traces/; an earlier report there is replaced (its files the new one "
                        "does not write are removed, other files stay)")
    parser.add_argument("--title", help="report title (default: ghpsim report: <scenario or file name>)")
    parser.add_argument("--strategies", default=None,
                        help=f"scenario INPUT: strategies to compare ({STRATEGIES_HELP}, or megatron; default "
                             "dp,mp,ghp, or a megatron scenario's own layout)")
    parser.add_argument("--profile", metavar="FILE", help=f"scenario INPUT: {PROFILE_HELP}")
    scenario_args(parser, scenario=False)


def sweep(parser: argparse.ArgumentParser) -> None:
    engine = next((name for name in ("pyarrow", "fastparquet") if importlib.util.find_spec(name)), None)
    parquet = (f"and {SWEEP_PARQUET_NAME} (engine: {engine})" if engine else
               f"({SWEEP_PARQUET_NAME} too when pyarrow or fastparquet is installed; neither is now)")
    parser.description = (f"Simulate the points of a sweep (a base scenario and axes; see scenarios/README.md, "
                          f"'Sweeps'). Finished points are committed one by one to DIR/{SWEEP_STORE_NAME}; a re-run "
                          f"skips them. Results go to DIR/{SWEEP_CSV_NAME} {parquet}.")
    parser.add_argument("sweep", help="sweep YAML file")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the store and the results")
    parser.add_argument("--scheduler", metavar="ADDRESS", default=None,
                        help="run on an existing dask.distributed cluster, e.g. tcp://host:8786 "
                             "(default: a local process pool)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="local worker processes (default: the number of CPUs; 1 = in this process)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (drawn only when stderr is a terminal)")
    parser.add_argument("--json", action="store_true", help="print a machine-readable summary")


def schedule(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=PIPELINE_KINDS, help="pipeline schedule")
    parser.add_argument("--stages", type=int, required=True, metavar="M", help="pipeline stages (ranks)")
    parser.add_argument("--microbatches", type=int, required=True, metavar="m", help="micro-batches per step")
    parser.add_argument("--virtual-stages", type=int, default=None, metavar="V",
                        help="model chunks per rank (interleaved_1f1b; default 2 there, 1 otherwise)")
    parser.add_argument("--weight-prediction", choices=("staggered", "forward"), default=None,
                        help="spectrain: predict before backwards too (staggered, the default) or not (forward)")
    parser.add_argument("--no-stash", action="store_true", help="pipedream without weight stashing (the order "
                        "and the grid are the same; --json's per-stage stashed versions are 0)")
    parser.add_argument("--json", action="store_true", help="print each rank's ops (ranks), slots, grid and per-stage figures as JSON")


def search(parser: argparse.ArgumentParser) -> None:
    scenario_args(parser)
    parser.add_argument("--gpus", default=None, metavar="P[,P...]",
                        help="device counts to search for (default: the scenario's GPUs)")
    parser.add_argument("--no-simulate", action="store_true",
                        help="skip playing each strategy's plan in the engine")
    parser.add_argument("--show-configs", action="store_true",
                        help="print PaSE's configuration of every layer for each p (default: for the last p only)")


def gallery(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=GALLERY_OUT, metavar="DIR", help=f"gallery folder (default {GALLERY_OUT})")
    parser.add_argument("--only", metavar="NAMES", help=f"comma list of entries ({', '.join(GALLERY_ENTRIES)}); "
                        "the index README is written only when every entry is built")
    parser.add_argument("--quick", action="store_true", help="reduced sizes (fewer nodes, GPUs, batches): for tests")
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")


def partition(parser: argparse.ArgumentParser) -> None:
    scenario_args(parser)
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="workers to partition over (default and most: the scenario's GPU count)")
    parser.add_argument("--profile", metavar="FILE", default=None,
                        help="profile for compute times instead of datasheet defaults: a calibration profile "
                             "(`ghpsim calibrate`; --workers at most its world size) or a kernel profile "
                             "(`ghpsim fit`, `calibrate --kernels`) of the scenario GPU's architecture")


def merge_profiles(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profiles", nargs="+", metavar="PROFILE", help="profiles from `ghpsim calibrate`, or pooled ones from an earlier merge")
    parser.add_argument("--out", required=True, metavar="FILE", help="where to write the pooled profile")
    parser.add_argument("--json", action="store_true", help="print what was written as JSON (out, profiles, calibrations)")


def fit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", metavar="RUNS.csv",
                        help="one row per measured run: measured_step_s, an optional base scenario column, "
                             "and dotted scenario keys (see simulator/fit.py)")
    parser.add_argument("--out", required=True, metavar="PROFILE.json", help="the kernel profile to write")
    parser.add_argument("--base", metavar="SCENARIO", help="scenario file for rows without a `base` column")
    parser.add_argument("--folds", type=int, default=5, help="k of the k-fold held-out error (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the folds' shuffle (default 0)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw each run's held-out prediction against its measured step time")
    parser.add_argument("--json", action="store_true",
                        help="print the fit as JSON: each run's held-out prediction and error, the files "
                             "written (out, plot) and any parameter at an end of its grid (at_grid_bound)")


def calibrate(parser: argparse.ArgumentParser) -> None:
    scenario_args(parser, scenario=False)
    parser.add_argument("--scenario", help="scenario whose model is profiled (required without --kernels)")
    parser.add_argument("--out", required=True, help="profile JSON to write, e.g. profiles/cpu.json")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the ranks compute: cpu, or cuda (one GPU a rank); default %(default)s")
    parser.add_argument("--kernels", action="store_true",
                        help="time kernels, not a model: GEMM efficiency over (M, N, K, dtype), memory-bound "
                             "bandwidth against size and launch overhead, into a kernel profile that "
                             "`simulate --profile` reads (validator/kernel_bench.py)")
    parser.add_argument("--gpu", metavar="NAME", default=None,
                        help="--kernels: catalogue GPU whose datasheet peaks the efficiencies divide by "
                             "(default: the CUDA device's own entry; on cpu the 'cpu' stand-in)")
    parser.add_argument("--dtypes", default=None, metavar="LIST",
                        help="--kernels: comma list of fp32, tf32, fp16, bf16 (default "
                             f"{','.join(KERNEL_DTYPES['cuda'])} on cuda, {','.join(KERNEL_DTYPES['cpu'])} on cpu); "
                             "the first sets gemm_efficiency")
    parser.add_argument("--quick", action="store_true", help="--kernels: tiny sizes, seconds (for tests)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="communication backend of the ranks (default gloo on cpu, nccl on cuda, one GPU "
                             "per rank); gloo on cuda lets "
                             "several ranks share one GPU (messages staged through the host)")
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks measured at once (default 2); `ghpsim validate` runs every plan at this world size")
    parser.add_argument("--batch-sizes", default=None, help="batch sizes each layer is timed at, per rank (comma list; "
                        f"default {','.join(map(str, CALIBRATE_BATCH_SIZES))})")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed samples (blocks of back-to-back iterations) per compute figure, which is "
                             f"their median (default {CALIBRATE_REPEATS}; with --kernels 5, or 3 with --quick; "
                             "validator/microbench.py)")
    parser.add_argument("--layer-passes", type=int, default=None,
                        help="sweeps over the layers, spread over the calibration; each figure is the "
                             f"median over them (default {CALIBRATE_LAYER_PASSES}; validator/layer_passes.py)")
    parser.add_argument("--fsdp", action="store_true",
                        help="also time FSDP2's host work per all-gather and reduce-scatter (the profile's fsdp, "
                             "for FSDP2 plans; needs --world-size >= 2; validator/fsdp_bench.py)")


def validate(parser: argparse.ArgumentParser) -> None:
    scenario_args(parser)
    parser.add_argument("--profile", required=True,
                        help="profile JSON from `ghpsim calibrate`; the plans run at its world size (a "
                             "scenario of another size is resized to it, or refused in one line)")
    parser.add_argument("--strategies", default=None,
                        help=f"{STRATEGIES_HELP}, or megatron (tp_degree = pp_degree = 1) (default dp,mp,ghp; "
                             "a megatron scenario with tp_degree = "
                             "pp_degree = 1: its own sharded data-parallel plan, run with FSDP2 or DDP)")
    parser.add_argument("--steps", type=int, default=10, help="measured steps (median reported; default %(default)s)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="launches of each strategy, in rounds (median over all their steps; default "
                             "%(default)s); on a shared machine 3-5 average over its spells of speed")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed training steps before the measured ones, in every launch (default 3)")
    parser.add_argument("--out", default="reports/validation", help="folder for CSV, plot and traces "
                        "(default %(default)s)")
    parser.add_argument("--step-spans", action="store_true",
                        help="also write every measured step's spans, all launches and ranks, to "
                             "OUT/traces/<strategy>.steps.csv (the traces hold the median step only)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is declared hung "
                        "(default %(default)g)")
    parser.add_argument("--pipeline-runtime", choices=("own", "torch"), default="own",
                        help="gpipe / 1f1b on our send/recv runtime or torch.distributed.pipelining's schedules "
                             "(default %(default)s)")
    parser.add_argument("--rank", action="store_true", help="run the planner's top candidates and others "
                        "for real: Kendall tau and top-1 regret (validator/rank_check.py)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="--rank: ranks (default and only value: the profile's world size)")
    parser.add_argument("--top", type=int, default=None, help="--rank: best-ranked candidates run (default 3)")
    parser.add_argument("--others", type=int, default=None,
                        help="--rank: further candidates, spread over the ranking (default 2)")


def import_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="package.module:factory returning an nn.Module")
    parser.add_argument("--input-shape", required=True, help="one sample's shape, e.g. 3,224,224")
    parser.add_argument("--out", required=True, help="layer-table YAML to write")
    parser.add_argument("--name", default=None, help="the model's name in the table (default: the factory's)")
    parser.add_argument("--json", action="store_true", help="print what was written as JSON (out, name, layers, runnable_by_validator)")
