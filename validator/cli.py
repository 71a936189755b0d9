"""`ghpsim`: the simulator's commands plus the validator's (calibrate, validate, import-model).

This is the console entry point. It lives in `validator` because the simulator never imports the
validator; torch is imported only when a validator command runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from simulator.cli import _add_scenario_args, main as simulator_main
from simulator.compare import STRATEGIES_HELP, parse_strategy_specs
from simulator.errors import ScenarioError
from simulator.model_source import resolve_workload
from simulator.output import write_text_atomic
from simulator.scenario import load_scenario
from validator.errors import RankFailure


def add_commands(commands) -> None:
    calibrate = commands.add_parser("calibrate", help="microbenchmark this machine into a cost profile")
    _add_scenario_args(calibrate, scenario=False)
    calibrate.add_argument("--scenario", required=True, help="scenario whose model is profiled")
    calibrate.add_argument("--out", required=True, help="profile JSON to write, e.g. profiles/cpu.json")
    calibrate.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    calibrate.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                           help="default gloo on cpu, nccl on cuda (one GPU per rank); gloo on cuda lets "
                                "several ranks share one GPU (messages staged through the host)")
    calibrate.add_argument("--world-size", type=int, default=2, help="ranks measured at once (validate at the same)")
    calibrate.add_argument("--batch-sizes", default=None, help="comma list, default the validator's")
    calibrate.add_argument("--repeats", type=int, default=None)
    calibrate.add_argument("--layer-passes", type=int, default=None,
                           help="sweeps over the layers, spread over the calibration; each figure is the "
                                "median over them (default 3; validator/layer_passes.py)")
    calibrate.add_argument("--jitter-passes", type=int, default=None,
                           help="whole-model passes per burst, 5 bursts spread over the calibration: the "
                                "pass-to-pass jitter behind the validator's percentile band (default 12; "
                                "0: none; validator/pass_jitter_bench.py)")

    validate = commands.add_parser("validate", help="run plans for real and compare with the prediction")
    _add_scenario_args(validate)
    validate.add_argument("--profile", required=True, help="profile JSON from `ghpsim calibrate`")
    validate.add_argument("--strategies", default="dp,mp,ghp", help=STRATEGIES_HELP)
    validate.add_argument("--steps", type=int, default=10, help="measured steps (median reported)")
    validate.add_argument("--repeats", type=int, default=1,
                          help="launches of each strategy, in rounds (median over all their steps); "
                               "on a shared machine 3-5 average over its spells of speed")
    validate.add_argument("--warmup", type=int, default=3)
    validate.add_argument("--speed-anchor", type=int, default=0, metavar="PASSES",
                          help="time PASSES whole-model passes in every launch, before and after its steps, "
                               "and also report the prediction rescaled to the machine's speed then vs at "
                               "calibration (validator/speed_anchor.py; 0: off)")
    validate.add_argument("--bracket", action="store_true",
                          help="calibrate again after the runs (PROFILE_after.json), pool both calibrations "
                               "(PROFILE_bracketed.json, `ghpsim merge-profiles`) and also report the prediction "
                               "from the pooled profile (validator/bracket.py)")
    validate.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                          help="calibrate a one-sweep slice (PROFILE_sliceN.json) after every ROUNDS rounds of "
                               "launches, pool them with the profile (PROFILE_interleaved.json) and also report "
                               "the prediction from the pool (validator/interleave.py; 0: off)")
    validate.add_argument("--out", default="reports/validation", help="folder for CSV, plot and traces")
    validate.add_argument("--step-spans", action="store_true",
                          help="also write every measured step's spans, all launches and ranks, to "
                               "OUT/traces/<strategy>.steps.csv (the traces hold the median step only)")
    validate.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is declared hung")
    validate.add_argument("--pipeline-runtime", choices=("own", "torch"), default="own",
                          help="gpipe / 1f1b on our send/recv runtime or torch.distributed.pipelining's schedules")
    validate.add_argument("--rank", action="store_true", help="run the planner's top candidates and others "
                          "for real: Kendall tau and top-1 regret (validator/rank_check.py)")
    validate.add_argument("--gpus", type=int, default=None, help="--rank: ranks (default the scenario's)")
    validate.add_argument("--top", type=int, default=3, help="--rank: best-ranked candidates run")
    validate.add_argument("--others", type=int, default=2, help="--rank: further candidates, spread over the ranking")

    importer = commands.add_parser("import-model", help="trace a torch.nn.Module into a layer table")
    importer.add_argument("target", help="package.module:factory returning an nn.Module")
    importer.add_argument("--input-shape", required=True, help="one sample's shape, e.g. 3,224,224")
    importer.add_argument("--out", required=True, help="layer-table YAML to write")
    importer.add_argument("--name", default=None)


def cmd_calibrate(args) -> int:
    from validator.calibrate import DEFAULT_BATCH_SIZES, DEFAULT_REPEATS, DEFAULT_TOPK_DENSITIES, calibrate
    from validator.layer_passes import DEFAULT_LAYER_PASSES
    layer_passes = DEFAULT_LAYER_PASSES if args.layer_passes is None else args.layer_passes
    if layer_passes < 1:
        raise ScenarioError(f"--layer-passes: {layer_passes} must be at least 1")
    from validator.pass_jitter_bench import DEFAULT_JITTER_PASSES
    jitter_passes = DEFAULT_JITTER_PASSES if args.jitter_passes is None else args.jitter_passes
    if jitter_passes < 0:
        raise ScenarioError(f"--jitter-passes: {jitter_passes} must be at least 0")
    from validator.comm_device import default_backend, device_problem
    problem = device_problem(args.device, args.backend or default_backend(args.device),
                             args.world_size)
    if problem:
        raise ScenarioError(f"--device {args.device} --backend {args.backend or 'default'}: {problem}")
    scenario = load_scenario(args.scenario, args.overrides)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    batch_sizes = _int_list(args.batch_sizes, "--batch-sizes") if args.batch_sizes else DEFAULT_BATCH_SIZES
    document = calibrate(workload, dict(scenario.model.params), args.out, device=args.device, backend=args.backend,
                         world_size=args.world_size, batch_sizes=batch_sizes,
                         repeats=args.repeats or DEFAULT_REPEATS, optimizer=scenario.training.optimizer,
                         topk_densities=sorted({*DEFAULT_TOPK_DENSITIES, scenario.strategy.compression_density}),
                         layer_passes=layer_passes, jitter_passes=jitter_passes)
    if args.json:
        print(json.dumps(document, indent=1))
    return 0


def cmd_validate(args) -> int:
    if args.rank:
        from validator.rank_check import cmd_validate_rank
        return cmd_validate_rank(args)
    import pandas as pd

    from simulator.tables import make_console
    from validator.measure import RunOptions
    from validator.report import (anchored_summary, bracketed_summary, headline_summary, interleaved_summary,
                                  write_plot, write_rows_csv, write_step_spans, write_traces)
    from validator.torch_pipelining import check_pipeline_runtime
    from validator.validate import mape_pct, validate

    specs = parse_strategy_specs(args.strategies)
    for kind, _groups in specs:
        check_pipeline_runtime(kind.partition(":")[0], args.pipeline_runtime)
    scenario = load_scenario(args.scenario, args.overrides)
    out = Path(args.out)
    stem = scenario.name
    rows_by_label: dict[str, dict] = {}

    def on_case(row, measured_spans, simulated):
        rows_by_label[row["strategy"]] = row  # a later round replaces the strategy's row
        write_rows_csv(list(rows_by_label.values()), out / f"{stem}.csv")
        write_traces(row["strategy"], measured_spans, simulated.spans, out / "traces")

    options = RunOptions(steps=args.steps, warmup=args.warmup, optimizer=scenario.training.optimizer,
                         pipeline_runtime=args.pipeline_runtime, anchor_passes=args.speed_anchor,
                         keep_step_spans=args.step_spans)
    if args.speed_anchor < 0:
        raise ScenarioError(f"--speed-anchor: {args.speed_anchor} must be 0 (off) or a number of passes")
    if args.repeats < 1:
        raise ScenarioError(f"--repeats: {args.repeats} must be at least 1")
    if args.interleave < 0 or args.interleave > args.repeats:
        raise ScenarioError(f"--interleave: {args.interleave} must be 0 (off) or a number of rounds up to "
                            f"--repeats ({args.repeats})")
    say = None if args.json else (lambda message: print(message, file=sys.stderr))
    slices = _calibration_slices(scenario, args.profile, args.interleave, say) if args.interleave else None
    validate(scenario, args.profile, specs, options, launch_timeout_s=args.timeout, on_case=on_case,
             progress=say, repeats=args.repeats, after_round=slices.after_round if slices else None,
             on_step_spans=lambda label, table: write_step_spans(label, table, out / "traces"))
    rows = list(rows_by_label.values())
    if slices:
        from validator.validate import predictions, with_second_prediction
        for problem in slices.disturbed:
            print(f"warning: disturbed calibration slice {problem}", file=sys.stderr)
        with_second_prediction(rows, predictions(scenario, str(slices.pooled()), specs, options), "interleaved")
        write_rows_csv(rows, out / f"{stem}.csv")
    if args.bracket:
        if not args.json:
            print("calibrating again after the runs (--bracket)", file=sys.stderr)
        _add_bracketed(rows, scenario, args.profile, specs, options)
        write_rows_csv(rows, out / f"{stem}.csv")
    frame = pd.DataFrame(rows)
    plot = write_plot(frame, out / f"{stem}.png", f"{stem}: predicted vs measured, MAPE {mape_pct(rows):.1f} %")
    if args.json:
        print(json.dumps({"scenario": stem, "mape_pct": mape_pct(rows), "rows": rows}, indent=1))
        return 0
    console = make_console()
    for row in rows:
        console.print(f"{row['strategy']:>22s}  predicted {row['predicted_s'] * 1e3:9.2f} ms  "
                      + (f"(under pass jitter {row['predicted_jitter_s'] * 1e3:.2f} ms)  "
                         if "predicted_jitter_s" in row else "")
                      + f"measured {row['measured_s'] * 1e3:9.2f} ms  error {row['error_pct']:+6.1f} %"
                      + (f" (under jitter {row['jitter_error_pct']:+6.1f} %)" if "jitter_error_pct" in row else "")
                      + (f"  (launches spread {row['launch_spread_pct']:.0f} %)" if row["launches"] > 1 else "")
                      + (f"  | speed x{row['speed_ratio']:.2f}: anchored {row['anchored_predicted_s'] * 1e3:.2f} ms "
                         f"{row['anchored_error_pct']:+6.1f} %" if "speed_ratio" in row else "")
                      + (f"  | bracketed {row['bracketed_predicted_s'] * 1e3:.2f} ms "
                         f"{row['bracketed_error_pct']:+6.1f} %"
                         if "bracketed_error_pct" in row else "")
                      + (f"  | interleaved {row['interleaved_predicted_s'] * 1e3:.2f} ms "
                         f"{row['interleaved_error_pct']:+6.1f} %"
                         if "interleaved_error_pct" in row else ""))
    console.print(headline_summary(frame).replace(f"cases {len(frame)} | ", "") + f"\n{out / (stem + '.csv')} | {plot}")
    if args.speed_anchor:
        console.print(anchored_summary(frame))
    if args.bracket:
        console.print(bracketed_summary(frame))
    if slices:
        console.print(interleaved_summary(frame))
    return 0


def _calibration_slices(scenario, profile_path: str, every_rounds: int, say):
    """The slices calibrated between the rounds, written beside the profile (validator/interleave.py)."""
    from validator.interleave import CalibrationSlices
    workload = resolve_workload(scenario.model, scenario.base_dir)
    profile = Path(profile_path)
    return CalibrationSlices(profile, workload, dict(scenario.model.params), every_rounds, profile.parent, say=say)


def _add_bracketed(rows: list[dict], scenario, profile_path: str, specs, options) -> None:
    """Calibrates again now, pools it with `profile_path` and adds the pooled profile's predictions
    to `rows` (`bracketed_*` columns; validator/bracket.py)."""
    from validator.bracket import bracketing_profile
    from validator.validate import predictions, with_second_prediction
    workload = resolve_workload(scenario.model, scenario.base_dir)
    pooled = bracketing_profile(Path(profile_path), workload, dict(scenario.model.params))
    with_second_prediction(rows, predictions(scenario, str(pooled), specs, options), "bracketed")


def cmd_import_model(args) -> int:
    from validator.import_model import import_model
    shape = tuple(_int_list(args.input_shape, "--input-shape"))
    document = import_model(args.target, shape, name=args.name)
    write_text_atomic(args.out, yaml.safe_dump(document, sort_keys=False))
    print(f"wrote {len(document['layers'])} layers to {args.out}")
    return 0


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ScenarioError(f"{option}: {text!r} is not a comma list of integers") from None
    if not values or min(values) < 1:
        raise ScenarioError(f"{option}: {text!r} needs positive integers")
    return values


EXTRA_COMMANDS = {"calibrate": cmd_calibrate, "validate": cmd_validate, "import-model": cmd_import_model}


def main(argv: list[str] | None = None) -> int:
    return simulator_main(argv, extend=add_commands, extra_commands=EXTRA_COMMANDS, user_errors=(RankFailure,))


if __name__ == "__main__":
    sys.exit(main())
