"""One-shot check of the kernel model on a lent GPU (issue 72, point 6): calibrate this device's
kernels (`ghpsim calibrate --kernels`), then time a few whole-model single-device training steps
of small GPT configurations from the simulator's zoo and print the simulator's step time with the
measured kernel profile, and with the catalogue's datasheet parameters, against the measured one.

    python3 benchmarks/gpu_kernel_check.py --device cuda --out reports/gpu/kernel_check
    python3 benchmarks/gpu_kernel_check.py --device cpu --quick --out /tmp/kernel_check   # seconds

Writes into --out: kernel_profile.json (the profile; `--profile FILE` reuses one instead of
calibrating), steps.csv (one row per model: measured and predicted step seconds, signed errors)
and summary.json (device, torch, MAPE of each prediction, the profile's parameters).

Measured step: the validator's modules of the zoo model (`validator.models.build_modules`), the LM
head's weight tied to the token embedding (one V x h matrix, as the zoo counts it and GPT-2 and
Megatron train it), parameters in the training dtype, random tokens (`validator.models.make_batch`);
a step is zero_grad, forward, loss, backward and the optimizer's step, enqueued back to back as a
training loop does; its time is the median over blocks of steps (`validator.kernel_bench.Clock`,
CUDA events, not behind a sleep: the host's own time counts where the GPU waits for it), after
warm-up steps. Attention is the validator's explicit one (scores, mask, softmax, context), so the
scenario has `costs.flash_attention: false`.

Predicted: the same model, batch, dtype and optimizer on one GPU of the catalogue entry the
profile divides by (`strategy.kind: dp`, one device), simulated with `costs.model: kernel`: once
with the kernel profile (`simulator.profile_costs.scenario_profile_costs`: its parameters and
measured tables), once with the catalogue's parameters alone (on CPU the catalogue's `cpu` entry
is a stand-in, so that column means little there).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from simulator.errors import ScenarioError  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.profile import load_profile  # noqa: E402
from simulator.profile_costs import scenario_profile_costs  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402
from simulator.simulate import simulate  # noqa: E402
from validator.calibrate import calibrate_kernels  # noqa: E402
from validator.kernel_bench import TORCH_DTYPES, Clock, KernelBenchSettings, tf32_matmul  # noqa: E402
from validator.layer_modules import Embedding, LMHead  # noqa: E402
from validator.models import build_modules, loss_fn, make_batch  # noqa: E402
from validator.optimizers import make_optimizer  # noqa: E402

GPT_SMALL_VOCAB = 50257
CONFIGS = {  # device: [(label, zoo name, params, batch size)]
    "cuda": [
        ("gpt-4x512-s256", "transformer",
         {"num_layers": 4, "hidden_size": 512, "num_heads": 8, "seq_len": 256, "vocab_size": GPT_SMALL_VOCAB}, 4),
        ("gpt2-small", "gpt2-small", {}, 8),
        ("gpt-24x1024-s1024", "transformer",
         {"num_layers": 24, "hidden_size": 1024, "num_heads": 16, "seq_len": 1024, "vocab_size": GPT_SMALL_VOCAB}, 8),
        ("gpt2-1.5b", "gpt2-1.5b", {}, 4),
    ],
    "cpu": [
        ("gpt-2x64-s32", "transformer",
         {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 32, "vocab_size": 256}, 4),
        ("gpt-2x128-s64", "transformer",
         {"num_layers": 2, "hidden_size": 128, "num_heads": 4, "seq_len": 64, "vocab_size": 512}, 4),
    ],
}
DEFAULT_DTYPE = {"cuda": "bf16", "cpu": "fp32"}
FIELDS = ("model", "params", "num_params", "batch_size", "dtype", "optimizer", "measured_step_s",
          "predicted_profile_s", "error_profile_pct", "predicted_datasheet_s", "error_datasheet_pct")


def tied_model(workload, device: str, dtype: str) -> torch.nn.Sequential:
    """The validator's modules in order, the head's weight the embedding's token table."""
    modules = build_modules(workload)
    if isinstance(modules[0], Embedding) and isinstance(modules[-1], LMHead):
        modules[-1].proj.weight = modules[0].token.weight
    return torch.nn.Sequential(*modules).to(device=device, dtype=TORCH_DTYPES[dtype])


def measure_step_s(workload, batch_size: int, device: str, dtype: str, optimizer: str, clock: Clock) -> float:
    model = tied_model(workload, device, dtype)
    update = make_optimizer(optimizer, list(model.parameters()), lr=1e-4)
    inputs, targets = (tensor.to(device) for tensor in make_batch(workload, batch_size))

    def step() -> None:
        update.zero_grad(set_to_none=True)
        loss_fn(workload, model(inputs), targets).backward()
        update.step()

    with tf32_matmul(dtype == "tf32"):
        step_s, _ = clock.time(step, cover=False)
    del model, update
    if device == "cuda":
        torch.cuda.empty_cache()
    return step_s


def scenario_for(label: str, zoo_name: str, params: dict, batch_size: int, gpu: str, dtype: str, optimizer: str):
    return scenario_from_dict({
        "name": label, "cluster": {"num_nodes": 1, "gpus_per_node": 1, "gpu": gpu},
        "model": {"name": zoo_name, "params": params}, "strategy": {"kind": "dp"},
        "training": {"global_batch_size": batch_size, "dtype": dtype, "optimizer": optimizer},
        "costs": {"model": "kernel", "flash_attention": False}}, label)


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def check(args) -> dict:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ScenarioError("--device cuda: torch sees no GPU on this machine")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = args.dtype or DEFAULT_DTYPE[args.device]
    if args.profile:
        profile_path = Path(args.profile)
        profile = load_profile(profile_path)
    else:
        profile_path = out / "kernel_profile.json"
        profile = calibrate_kernels(profile_path, args.device, gpu=args.gpu, quick=args.quick,
                                    dtypes=_dtypes(args.device, dtype))
    if getattr(profile, "measured", None) is None:
        raise ScenarioError(f"{profile_path}: not a kernel profile from `ghpsim calibrate --kernels`")
    gpu = profile.measured.gpu
    clock = Clock(KernelBenchSettings(args.device, (dtype,), (), (), (), (), repeats=args.repeats, warmup=2,
                                      min_block_s=0.05 if args.device == "cuda" else 0.01,
                                      num_threads=1 if args.device == "cpu" else None))
    threads = torch.get_num_threads()
    rows = []
    for label, zoo_name, params, batch_size in CONFIGS[args.device]:
        scenario = scenario_for(label, zoo_name, params, batch_size, gpu, dtype, args.optimizer)
        workload = resolve_workload(scenario.model, scenario.base_dir)
        print(f"[check] {label}: {workload.num_params / 1e6:.1f} M parameters, batch {batch_size}, {dtype}",
              file=sys.stderr, flush=True)
        torch.set_num_threads(clock.settings.num_threads or threads)
        try:
            measured = measure_step_s(workload, batch_size, args.device, dtype, args.optimizer, clock)
        except torch.cuda.OutOfMemoryError:
            print(f"[check] {label}: out of GPU memory, skipped", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
            continue
        finally:
            torch.set_num_threads(threads)
        with_profile = simulate(scenario, costs=scenario_profile_costs(profile_path, scenario, workload),
                                workload=workload).step_time_s
        datasheet = simulate(scenario, workload=workload).step_time_s
        rows.append({"model": label, "params": json.dumps(params or {"zoo": zoo_name}),
                     "num_params": workload.num_params, "batch_size": batch_size, "dtype": dtype,
                     "optimizer": args.optimizer, "measured_step_s": measured,
                     "predicted_profile_s": with_profile, "error_profile_pct": error_pct(with_profile, measured),
                     "predicted_datasheet_s": datasheet, "error_datasheet_pct": error_pct(datasheet, measured)})
        with (out / "steps.csv").open("w", newline="") as handle:  # after every model: a cut run keeps its rows
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    summary = {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": profile.measured.device.model_dump(), "gpu": gpu, "torch_version": torch.__version__,
        "profile": str(profile_path), "parameters": dict(profile.parameters), "dtype": dtype,
        "mape_profile_pct": statistics.fmean([abs(row["error_profile_pct"]) for row in rows] or [math.nan]),
        "mape_datasheet_pct": statistics.fmean([abs(row["error_datasheet_pct"]) for row in rows] or [math.nan]),
        "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _dtypes(device: str, dtype: str) -> list[str]:
    """The step dtype first (it sets gemm_efficiency), then the device's usual others."""
    others = ("fp16", "bf16", "fp32") if device == "cuda" else ()
    return [dtype, *(other for other in others if other != dtype)]


def print_table(summary: dict) -> None:
    print(f"{'model':<20} {'params':>9} {'batch':>5} {'measured':>10} {'profile':>10} {'err':>7} "
          f"{'datasheet':>10} {'err':>7}")
    for row in summary["rows"]:
        print(f"{row['model']:<20} {row['num_params'] / 1e6:>8.1f}M {row['batch_size']:>5} "
              f"{1e3 * row['measured_step_s']:>8.2f}ms {1e3 * row['predicted_profile_s']:>8.2f}ms "
              f"{row['error_profile_pct']:>+6.1f}% {1e3 * row['predicted_datasheet_s']:>8.2f}ms "
              f"{row['error_datasheet_pct']:>+6.1f}%")
    print(f"MAPE: measured kernel profile {summary['mape_profile_pct']:.1f} %, datasheet "
          f"{summary['mape_datasheet_pct']:.1f} % ({summary['gpu']}, {summary['device']['name']}, {summary['dtype']})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the profile, steps.csv, summary.json")
    parser.add_argument("--gpu", default=None, help="catalogue GPU of the datasheet figures (default: detected)")
    parser.add_argument("--dtype", choices=tuple(TORCH_DTYPES), default=None,
                        help="training dtype (default bf16 on cuda, fp32 on cpu)")
    parser.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="adam")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks of steps per model (median)")
    parser.add_argument("--quick", action="store_true", help="the kernel calibration's tiny sizes (tests)")
    parser.add_argument("--profile", default=None, help="reuse this kernel profile instead of calibrating")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats} must be at least 1")
    try:
        summary = check(args)
    except ScenarioError as error:
        print(f"gpu_kernel_check: error: {error}", file=sys.stderr)
        return 2
    print_table(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
