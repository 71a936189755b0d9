"""The validator's commands: calibrate, validate and import-model (arguments: `ghpsim.arguments`).

Imported only when one of them runs; torch comes in with the validator modules each command
imports inside its function, so the rest of `ghpsim` runs without torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from simulator.compare import DEFAULT_STRATEGIES, check_distinct, parse_strategy_specs
from simulator.errors import ScenarioError, one_line
from simulator.model_source import resolve_workload
from simulator.output import check_distinct_files, check_output_file, check_output_folder, file_stem, write_text_atomic
from simulator.scenario import load_scenario


MAX_REPEATS = 100
"""Most launches of each strategy (`validate --repeats`), or timed samples and layer sweeps of each
figure (`calibrate --repeats`, `--layer-passes`): a median settles long before."""


def cmd_calibrate(args) -> int:
    """Every flag and --out are checked before torch loads and before any microbenchmark runs."""
    for option, value, least in (("--layer-passes", args.layer_passes, 1), ("--repeats", args.repeats, 1),
                                 ("--world-size", args.world_size, 1)):
        if value is not None and value < least:
            raise ScenarioError(f"{option}: {value} must be at least {least}")
    for option, value in (("--layer-passes", args.layer_passes), ("--repeats", args.repeats)):
        if value is not None and value > MAX_REPEATS:
            raise ScenarioError(f"{option}: {value} must be at most {MAX_REPEATS} (each repeats the measurement)")
    check_output_file(args.out, "--out")  # one profile file: not a folder, nor a name ending in a separator
    check_distinct_files({"--out": args.out}, {"--scenario": args.scenario})
    from simulator.profile import profile_document
    from validator.calibrate import DEFAULT_BATCH_SIZES, DEFAULT_REPEATS, DEFAULT_TOPK_DENSITIES, calibrate
    from validator.layer_passes import DEFAULT_LAYER_PASSES
    from validator.models import model_field
    if args.kernels:
        if args.fsdp:
            raise ScenarioError("--fsdp: not used with --kernels")
        return _calibrate_kernels(args)
    if args.scenario is None:
        raise ScenarioError("--scenario: required (the model to profile), unless --kernels")
    for option in ("gpu", "dtypes", "quick"):
        if getattr(args, option):
            raise ScenarioError(f"--{option}: only with --kernels")
    world_size = 2 if args.world_size is None else args.world_size
    _check_world_size(args.device, args.backend, world_size, given=args.world_size is not None)
    batch_sizes = DEFAULT_BATCH_SIZES
    if args.batch_sizes is not None:
        batch_sizes = _int_list(args.batch_sizes, "--batch-sizes")
        check_distinct(batch_sizes, args.batch_sizes, "--batch-sizes")
        _check_batch_sizes(batch_sizes, args.batch_sizes)
    scenario = load_scenario(args.scenario, args.overrides)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    _check_model_fits_host(args.device, args.scenario, workload)
    profile = calibrate(workload, dict(scenario.model.params), args.out, device=args.device, backend=args.backend,
                        world_size=world_size, batch_sizes=batch_sizes,
                        repeats=args.repeats or DEFAULT_REPEATS, optimizer=scenario.training.optimizer,
                        topk_densities=sorted({*DEFAULT_TOPK_DENSITIES, scenario.strategy.compression_density}),
                        layer_passes=args.layer_passes or DEFAULT_LAYER_PASSES, verbose=not args.json,
                        model_source=model_field(scenario.model), fsdp=args.fsdp)
    if args.json:
        print(json.dumps(profile_document(profile), indent=1))
    return 0


def _check_model_fits_host(device: str, scenario_path: str, workload) -> None:
    """ScenarioError naming --scenario when one fp32 copy of the model's weights, which a CPU rank
    builds to time its layers (a lower bound of what calibration needs), exceeds the memory this host
    has available: refused before any rank starts instead of a rank killed for running out of memory."""
    from simulator.limits import available_memory_bytes
    needed_bytes, available_bytes = 4.0 * workload.num_params, available_memory_bytes()
    if device == "cpu" and needed_bytes > available_bytes:
        raise ScenarioError(f"--scenario {scenario_path}: {workload.name} has {workload.num_params:,.0f} parameters, "
                            f"{needed_bytes / 2**30:,.1f} GiB as one fp32 copy of its weights, more than the "
                            f"{available_bytes / 2**30:.1f} GiB this host has available; calibrate a smaller "
                            "model of the same layer kinds (model.params) on a CPU host")


def _check_world_size(device: str, backend: str | None, world_size: int, given: bool) -> None:
    """ScenarioError naming --world-size where this host cannot run that many ranks on `device`
    with `backend` (`validator.comm_device.device_problem`) though it can run one: the number of
    ranks is at fault, not the device or backend (those `validator.calibrate.calibrate` names)."""
    from validator.comm_device import default_backend, device_problem
    backend = backend or default_backend(device)
    problem = device_problem(device, backend, world_size)
    if problem and not device_problem(device, backend, 1):
        default = "" if given else " (the default)"
        raise ScenarioError(f"--world-size {world_size}{default}: device {device!r}, backend {backend!r}: {problem}")


def _check_batch_sizes(batch_sizes: list[int], text: str) -> None:
    """ScenarioError naming --batch-sizes and its text unless it gives two sizes (the fits need two
    points) and none above what a calibration times (`validator.calibrate.MAX_CALIBRATION_BATCH`)."""
    from validator.calibrate import MAX_CALIBRATION_BATCH
    if len(set(batch_sizes)) < 2:
        raise ScenarioError(f"--batch-sizes {text!r}: need at least two distinct positive batch sizes "
                            "(each layer's time is fitted as a line over them), e.g. 4,16")
    if max(batch_sizes) > MAX_CALIBRATION_BATCH:
        raise ScenarioError(f"--batch-sizes {text!r}: {max(batch_sizes)} is larger than the {MAX_CALIBRATION_BATCH} "
                            "samples a calibration times (the fits extrapolate beyond the largest)")


def _calibrate_kernels(args) -> int:
    """`ghpsim calibrate --kernels`: a kernel profile of this device (`validator.calibrate.calibrate_kernels`)."""
    from simulator.profile import profile_document
    from validator.calibrate import calibrate_kernels
    for option in ("scenario", "backend", "batch_sizes", "layer_passes", "world_size"):
        if getattr(args, option) is not None:
            raise ScenarioError(f"--{option.replace('_', '-')}: not used with --kernels")
    if args.overrides:
        raise ScenarioError("--set: not used with --kernels")
    check_output_file(args.out, "--out")
    dtypes = [part.strip() for part in args.dtypes.split(",") if part.strip()] if args.dtypes is not None else None
    if dtypes == []:
        raise ScenarioError(f"--dtypes {args.dtypes!r}: empty (a comma list of fp32, tf32, fp16, bf16)")
    profile = calibrate_kernels(args.out, args.device, gpu=args.gpu, dtypes=dtypes, quick=args.quick,
                                repeats=args.repeats, verbose=not args.json)
    if args.json:
        print(json.dumps(profile_document(profile), indent=1))
    return 0


EXIT_INTERRUPTED = 130
"""The exit code of an interrupted command (128 + SIGINT), as `ghpsim.cli.main` returns it."""

RANK_ONLY = ("gpus", "top", "others")
"""`ghpsim validate` flags that only apply with --rank."""


def cmd_validate(args) -> int:
    """Predicted vs measured (or with --rank, the planner's order for real). Every flag and the
    --out folder are checked before anything runs; the results are written once every case has run,
    through a staging folder (`validator.report.staged_folder`), so --out gets every file or none.
    A failed rank ends the run in one line; the strategies measured before it are written first
    (`validator.validate_output.kept_after_failure`), and the line says where. So does an interrupt
    (Ctrl-C), whose line begins `ghpsim: interrupted` (exit code 130)."""
    check_validate_flags(args)
    if args.rank:
        from validator.models import check_torch_specs, model_field
        from validator.rank_check import cmd_validate_rank
        scenario = load_scenario(args.scenario, args.overrides)  # before the profile is read, as validate does
        check_torch_specs(resolve_workload(scenario.model, scenario.base_dir), model_field(scenario.model))
        return cmd_validate_rank(args)
    from simulator.tables import make_console
    from validator.errors import RankFailure
    from validator.measure import RunOptions
    from validator.report import case_line, error_summary, summary_line
    from validator.torch_pipelining import check_pipeline_runtime
    from validator.validate import memory_line, validate
    from validator.validate_output import Kept, kept_after_failure, kept_after_interrupt, write_results

    specs = parse_strategy_specs(DEFAULT_STRATEGIES if args.strategies is None else args.strategies)  # each once
    for kind, _groups in specs:
        check_pipeline_runtime(kind.partition(":")[0], args.pipeline_runtime)
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise ScenarioError(f"--repeats: {args.repeats} must be from 1 to {MAX_REPEATS} (launches of each strategy)")
    scenario = load_scenario(args.scenario, args.overrides)
    if scenario.strategy.kind == "megatron" and args.strategies is None:
        specs = [("megatron", None)]  # its own plan (validator.fsdp_runtime: tp = pp = 1)
    out, stem = Path(args.out), file_stem(scenario.name)
    for name in (f"{stem}.csv", f"{stem}.png"):
        check_output_file(out / name, "--out")
    check_output_folder(out / "traces", "--out")
    options = RunOptions(steps=args.steps, warmup=args.warmup, optimizer=scenario.training.optimizer,
                         pipeline_runtime=args.pipeline_runtime, keep_step_spans=args.step_spans)
    say = None if args.json else (lambda message: print(message, file=sys.stderr))
    kept = Kept()  # every strategy's row, spans and prediction after each of its launches
    try:
        validate(scenario, args.profile, specs, options, launch_timeout_s=args.timeout, progress=say,
                 on_case=kept.case, repeats=args.repeats, on_step_spans=kept.step_spans.__setitem__,
                 skip_unfit_ghp=args.strategies is None)
    except RankFailure as failure:
        raise kept_after_failure(failure, kept, out, stem, args.repeats) from None
    except KeyboardInterrupt:  # Ctrl-C: as a failed rank, the strategies measured before it are kept
        if not kept.cases:
            raise
        print(one_line(f"ghpsim: {kept_after_interrupt(kept, out, stem, args.repeats)}"), file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        paths = write_results(kept, out, stem)  # a stop that comes while it writes waits for the files
    except KeyboardInterrupt:  # ... and is reported as one during the run: the results are kept
        print(one_line(f"ghpsim: {kept_after_interrupt(kept, out, stem, args.repeats)}"), file=sys.stderr)
        return EXIT_INTERRUPTED
    rows, summary = kept.rows(), error_summary(kept.rows())
    if args.json:  # csv, plot: the files; traces: their folder; files: every file written
        print(json.dumps({"scenario": stem, **summary, **paths, "rows": rows}, indent=1))
        return 0
    console = make_console()
    for row in rows:
        console.print(case_line(row))
        if memory_line(row):
            console.print(memory_line(row))
    console.print(f"{summary_line(summary)}\n{paths['csv']} | {paths['plot']}")
    return 0


def check_validate_flags(args) -> None:
    """One-line ScenarioError for a flag of the other mode (--gpus / --top / --others without --rank;
    --strategies or --pipeline-runtime torch with it), an empty --strategies, or an --out that cannot
    be a folder: before anything loads or runs."""
    if args.rank:
        if args.strategies is not None:
            raise ScenarioError(f"--strategies {args.strategies!r}: not with --rank (the planner picks the "
                                "candidates); leave --rank out to validate these strategies")
        if getattr(args, "pipeline_runtime", "own") != "own":
            raise ScenarioError(f"--pipeline-runtime {args.pipeline_runtime}: not with --rank (its candidates run "
                                "on the validator's own runtime)")
    else:
        for name in RANK_ONLY:
            if getattr(args, name, None) is not None:
                raise ScenarioError(f"--{name} {getattr(args, name)}: only with --rank")
        if args.strategies is not None and not args.strategies.replace(",", "").strip():
            raise ScenarioError(f"--strategies {args.strategies!r}: empty (give a comma list such as "
                                f"{DEFAULT_STRATEGIES}, or leave the flag out for that default)")
    if str(args.out) == "":
        raise ScenarioError("--out: needs a folder name (got '')")
    out = Path(args.out)
    if out.is_symlink() and not out.exists():
        raise ScenarioError(f"--out {out}: a symbolic link to nothing")
    check_output_folder(out, "--out")
    from validator.report import check_writable_folder
    check_writable_folder(out, "--out")


def cmd_import_model(args) -> int:
    from validator.import_model import check_table_name, import_model
    shape = tuple(_int_list(args.input_shape, "--input-shape"))
    check_table_name(args.name, "--name")
    check_output_file(args.out, "--out")  # before the user's code runs
    if Path(args.out).suffix.lower() not in (".yaml", ".yml"):  # a layer table in YAML, as model.file reads it
        raise ScenarioError(f"--out {args.out}: the layer table is written in YAML; name it .yaml or .yml")
    if not args.json:  # on stdout: an error stays the only line on stderr
        print(f"note: import-model imports {args.target.split(':')[0]!r} (the current folder included) and runs "
              f"its code with your permissions (SECURITY.md)")
    document = import_model(args.target, shape, name=args.name)
    write_text_atomic(args.out, yaml.safe_dump(document, sort_keys=False))
    count = len(document["layers"])
    if args.json:  # no torch specs: calibrate / validate refuse the table (validator.models)
        print(json.dumps({"out": str(args.out), "name": document.get("name"), "layers": count,
                          "runnable_by_validator": False}))
    else:
        print(f"wrote {count} layer{'' if count == 1 else 's'} to {args.out} "
              f"(for simulate/compare/rank; not calibrate/validate: no torch specs)")
    return 0


def _int_list(text: str, option: str) -> list[int]:
    parts = text.split(",")
    if any(not part.strip() for part in parts):
        raise ScenarioError(f"{option}: {text!r} has an empty item (a comma list of integers, e.g. 4,16,64)")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        raise ScenarioError(f"{option}: {text!r} is not a comma list of integers") from None
    if not values or min(values) < 1:
        raise ScenarioError(f"{option}: {text!r} needs positive integers")
    return values
