"""One-shot check of the kernel model on a lent GPU (issue 72, point 6): calibrate this device's
kernels (`ghpsim calibrate --kernels`), then time a few whole-model single-device training steps
of small GPT and LLaMA configurations from the simulator's zoo and print the simulator's step time with the
measured kernel profile, and with the catalogue's datasheet parameters, against the measured one.

    python3 benchmarks/gpu_kernel_check.py --device cuda --out reports/gpu/kernel_check
    python3 benchmarks/gpu_kernel_check.py --device cpu --quick --out /tmp/kernel_check   # seconds

Writes into --out: kernel_profile.json (the profile; `--profile FILE` reuses one instead of
calibrating), steps.csv (one row per model and recipe: measured and predicted step seconds, signed
errors) and summary.json (device, torch, MAPE of each prediction, the profile's parameters).

Measured step: the validator's modules of the zoo model (`validator.models.build_modules`), the LM
head's weight tied to the token embedding (one V x h matrix, as the zoo counts it and GPT-2 and
Megatron train it), parameters in the training dtype, random tokens (`validator.models.make_batch`);
a step is zero_grad, forward, loss, backward and the optimizer's step, enqueued back to back as a
training loop does; its time is the median over blocks of steps (`validator.kernel_bench.Clock`,
CUDA events, not behind a sleep: the host's own time counts where the GPU waits for it), after
warm-up steps. Each model runs under three recipes (`RECIPES`, `--recipes`):
- `eager`: torch's default Adam (one kernel per tensor-list operation, `foreach`) and the
  validator's explicit attention (scores, mask, softmax, context as separate kernels);
- `fused_adam`: Adam as one fused kernel per tensor list (`fused=True`: the multi-tensor kernel
  the simulator prices, as Megatron's apex/TransformerEngine Adam), explicit attention;
- `fused_adam_flash`: also attention as torch's scaled_dot_product_attention (flash attention,
  `validator.attention_core.fused_attention`); the scenario has `costs.flash_attention: true`.
On CUDA one more step runs under torch.profiler: the GPU's busy time (the union of its kernels'
intervals), the kernel count, and each kernel name's count and total time (kernels.csv) show
where the step's time goes (a step longer than its busy time waited on the host).

Predicted: the same model, batch, dtype and optimizer on one GPU of the catalogue entry the
profile divides by (`strategy.kind: dp`, one device, the zoo model without dropout as the
validator's modules have none), simulated with `costs.model: kernel`: once with the kernel
profile (`simulator.profile_costs.scenario_profile_costs`: its parameters and measured tables),
once with the catalogue's parameters alone (on CPU the catalogue's `cpu` entry is a stand-in, so
that column means little there).
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
from validator.attention_core import fused_attention  # noqa: E402
from validator.calibrate import calibrate_kernels  # noqa: E402
from validator.kernel_bench import TORCH_DTYPES, Clock, KernelBenchSettings, tf32_matmul  # noqa: E402
from validator.kernel_trace import busy_s, kernel_trace  # noqa: E402
from validator.layer_modules import Embedding, LMHead  # noqa: E402
from validator.models import build_modules, loss_fn, make_batch  # noqa: E402
from validator.optimizers import make_optimizer  # noqa: E402

GPT_SMALL_VOCAB = 50257
LLAMA_SMALL_VOCAB = 32000  # LLaMA-1/2 tokenizer
MODELS = {  # label: (zoo name, params); no dropout: the validator's modules have none
    "gpt-4x512-s256": ("transformer", {"num_layers": 4, "hidden_size": 512, "num_heads": 8, "seq_len": 256,
                                       "vocab_size": GPT_SMALL_VOCAB, "dropout": 0.0}),
    "gpt2-small": ("gpt2-small", {"dropout": 0.0}),
    "gpt-24x1024-s1024": ("transformer", {"num_layers": 24, "hidden_size": 1024, "num_heads": 16, "seq_len": 1024,
                                          "vocab_size": GPT_SMALL_VOCAB, "dropout": 0.0}),
    "gpt2-1.5b": ("gpt2-1.5b", {"dropout": 0.0}),
    "llama-8x2048-gqa4-s2048": ("llama", {"num_layers": 8, "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 4,
                                          "seq_len": 2048, "vocab_size": LLAMA_SMALL_VOCAB}),
    "llama-16x4096-gqa8-s2048": ("llama", {"num_layers": 16, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8,
                                           "seq_len": 2048, "vocab_size": LLAMA_SMALL_VOCAB}),
    "gpt-2x64-s32": ("transformer", {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 32,
                                     "vocab_size": 256, "dropout": 0.0}),
    "gpt-2x128-s64": ("transformer", {"num_layers": 2, "hidden_size": 128, "num_heads": 4, "seq_len": 64,
                                      "vocab_size": 512, "dropout": 0.0}),
    "llama-2x64-gqa2-s32": ("llama", {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
                                      "seq_len": 32, "vocab_size": 256}),
}


def configs(*batches: tuple[str, int]) -> list[tuple[str, str, dict, int]]:
    """(label, zoo name, params, batch size) of each (label of `MODELS`, batch size)."""
    return [(label, *MODELS[label], batch_size) for label, batch_size in batches]


def config_of(configs_by_device: dict, label: str) -> tuple[str, str, dict, int]:
    """The configuration called `label` among a script's CUDA and CPU ones."""
    return next(config for config in configs_by_device["cuda"] + configs_by_device["cpu"] if config[0] == label)


CONFIGS = {
    "cuda": configs(("gpt-4x512-s256", 4), ("gpt2-small", 8), ("gpt-24x1024-s1024", 8), ("gpt2-1.5b", 4),
                    ("llama-8x2048-gqa4-s2048", 4)),
    "cpu": configs(("gpt-2x64-s32", 4), ("gpt-2x128-s64", 4), ("llama-2x64-gqa2-s32", 4)),
}
RECIPES = {  # name: (Adam as one fused kernel per tensor list, attention as flash attention)
    "eager": (False, False), "fused_adam": (True, False), "fused_adam_flash": (True, True)}
DEFAULT_DTYPE = {"cuda": "bf16", "cpu": "fp32"}
FIELDS = ("model", "recipe", "params", "num_params", "batch_size", "dtype", "optimizer", "measured_step_s",
          "measured_gpu_busy_s", "measured_kernels", "predicted_profile_s", "error_profile_pct",
          "predicted_datasheet_s", "error_datasheet_pct")
KERNEL_FIELDS = ("model", "recipe", "kernel", "count", "total_s")


def tied_model(workload, device: str, dtype: str) -> torch.nn.Sequential:
    """The validator's modules in order, the head's weight the embedding's token table."""
    modules = build_modules(workload)
    if isinstance(modules[0], Embedding) and isinstance(modules[-1], LMHead):
        modules[-1].proj.weight = modules[0].token.weight
    return torch.nn.Sequential(*modules).to(device=device, dtype=TORCH_DTYPES[dtype])


def make_update(name: str, parameters, fused: bool) -> torch.optim.Optimizer:
    """The optimizer `name`; Adam and SGD as torch's fused kernels when `fused`."""
    if not fused:
        return make_optimizer(name, parameters, lr=1e-4)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=1e-4, fused=True)
    return torch.optim.SGD(parameters, lr=1e-4, momentum=0.9 if name == "momentum" else 0.0, fused=True)


def measure_recipes(workload, batch_size: int, device: str, dtype: str, optimizer: str, clock: Clock,
                    recipes) -> dict[str, dict]:
    """Per recipe: the median step seconds, and on CUDA one profiled step's busy seconds and kernels."""
    model = tied_model(workload, device, dtype)
    inputs, targets = (tensor.to(device) for tensor in make_batch(workload, batch_size))
    measured = {}
    for recipe in recipes:
        fused_update, flash = RECIPES[recipe]
        update = make_update(optimizer, list(model.parameters()), fused_update)

        def step() -> None:
            update.zero_grad(set_to_none=True)
            loss_fn(workload, model(inputs), targets).backward()
            update.step()

        with tf32_matmul(dtype == "tf32"), fused_attention(flash):
            step_s, _ = clock.time(step, cover=False)
            kernels = kernel_trace(step, device)
        measured[recipe] = {"step_s": step_s, "busy_s": busy_s(kernels) if kernels else math.nan,
                            "kernels": kernels}
        update.zero_grad(set_to_none=True)
        del update
        if device == "cuda":
            torch.cuda.empty_cache()
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return measured


def kernel_totals(model: str, recipe: str, kernels: list[dict]) -> list[dict]:
    """One row per kernel name: its launches and total seconds in the profiled step, longest first."""
    totals: dict[str, list] = {}
    for kernel in kernels:
        entry = totals.setdefault(kernel["name"][:200], [0, 0.0])
        entry[0] += 1
        entry[1] += kernel["dur"] * 1e-6
    return [{"model": model, "recipe": recipe, "kernel": name, "count": count, "total_s": total}
            for name, (count, total) in sorted(totals.items(), key=lambda item: -item[1][1])]


def scenario_for(label: str, zoo_name: str, params: dict, batch_size: int, gpu: str, dtype: str, optimizer: str,
                 flash: bool = False):
    return scenario_from_dict({
        "name": label, "cluster": {"num_nodes": 1, "gpus_per_node": 1, "gpu": gpu},
        "model": {"name": zoo_name, "params": params}, "strategy": {"kind": "dp"},
        "training": {"global_batch_size": batch_size, "dtype": dtype, "optimizer": optimizer},
        "costs": {"model": "kernel", "flash_attention": flash}}, label)


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
    rows, kernel_rows = [], []
    for label, zoo_name, params, batch_size in CONFIGS[args.device]:
        base = scenario_for(label, zoo_name, params, batch_size, gpu, dtype, args.optimizer)
        workload = resolve_workload(base.model, base.base_dir)
        print(f"[check] {label}: {workload.num_params / 1e6:.1f} M parameters, batch {batch_size}, {dtype}",
              file=sys.stderr, flush=True)
        torch.set_num_threads(clock.settings.num_threads or threads)
        try:
            measured = measure_recipes(workload, batch_size, args.device, dtype, args.optimizer, clock, args.recipes)
        except torch.cuda.OutOfMemoryError:
            print(f"[check] {label}: out of GPU memory, skipped", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
            continue
        finally:
            torch.set_num_threads(threads)
        for recipe, result in measured.items():
            with_profile, datasheet = predict(label, recipe, gpu, dtype, args.optimizer, profile_path, workload)
            step_s = result["step_s"]
            rows.append({"model": label, "recipe": recipe, "params": json.dumps(params or {"zoo": zoo_name}),
                         "num_params": workload.num_params, "batch_size": batch_size, "dtype": dtype,
                         "optimizer": args.optimizer, "measured_step_s": step_s,
                         "measured_gpu_busy_s": result["busy_s"], "measured_kernels": len(result["kernels"]),
                         "predicted_profile_s": with_profile, "error_profile_pct": error_pct(with_profile, step_s),
                         "predicted_datasheet_s": datasheet, "error_datasheet_pct": error_pct(datasheet, step_s)})
            kernel_rows += kernel_totals(label, recipe, result["kernels"])
        write_csv(out / "steps.csv", FIELDS, rows)  # after every model: a cut run keeps its rows
        if kernel_rows:
            write_csv(out / "kernels.csv", KERNEL_FIELDS, kernel_rows)
    summary = summarise(rows, profile, profile_path, dtype, torch.__version__)
    summary["measured_utc"] = summary["created_utc"]
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def predict(label: str, recipe: str, gpu: str, dtype: str, optimizer: str, profile_path, workload=None):
    """(with the kernel profile, with the catalogue alone) step seconds of CUDA configuration `label`."""
    _, zoo_name, params, batch_size = config_of(CONFIGS, label)
    scenario = scenario_for(label, zoo_name, params, batch_size, gpu, dtype, optimizer, flash=RECIPES[recipe][1])
    workload = workload or resolve_workload(scenario.model, scenario.base_dir)
    with_profile = simulate(scenario, costs=scenario_profile_costs(profile_path, scenario, workload),
                            workload=workload).step_time_s
    return with_profile, simulate(scenario, workload=workload).step_time_s


def summarise(rows: list[dict], profile, profile_path, dtype: str, torch_version: str) -> dict:
    recipes = list(dict.fromkeys(row["recipe"] for row in rows))
    return {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": profile.measured.device.model_dump(), "gpu": profile.measured.gpu, "torch_version": torch_version,
        "profile": str(profile_path), "parameters": dict(profile.parameters), "dtype": dtype,
        "mape_profile_pct": statistics.fmean([abs(row["error_profile_pct"]) for row in rows] or [math.nan]),
        "mape_datasheet_pct": statistics.fmean([abs(row["error_datasheet_pct"]) for row in rows] or [math.nan]),
        "mape_by_recipe_pct": {recipe: {
            column: statistics.fmean([abs(row[f"error_{column}_pct"]) for row in rows if row["recipe"] == recipe])
            for column in ("profile", "datasheet")} for recipe in recipes},
        "rows": rows}


def repredict(folder: Path) -> dict:
    """Re-predict a committed check (its steps.csv, kernel_profile.json and summary.json) with this
    simulator: the measured columns stay, the predicted ones and the summary are rewritten."""
    steps, profile_path = folder / "steps.csv", folder / "kernel_profile.json"
    for path in (steps, profile_path, folder / "summary.json"):
        if not path.is_file():
            raise ScenarioError(f"--repredict: {path} not found")
    profile = load_profile(profile_path)
    old = json.loads((folder / "summary.json").read_text())
    rows = []
    with steps.open() as handle:
        for row in csv.DictReader(handle):
            measured = float(row["measured_step_s"])
            with_profile, datasheet = predict(row["model"], row["recipe"], profile.measured.gpu, row["dtype"],
                                              row["optimizer"], profile_path)
            rows.append({**row, "num_params": int(row["num_params"]), "batch_size": int(row["batch_size"]),
                         "measured_step_s": measured, "measured_gpu_busy_s": float(row["measured_gpu_busy_s"]),
                         "measured_kernels": int(row["measured_kernels"]),
                         "predicted_profile_s": with_profile, "error_profile_pct": error_pct(with_profile, measured),
                         "predicted_datasheet_s": datasheet, "error_datasheet_pct": error_pct(datasheet, measured)})
    write_csv(steps, FIELDS, rows)
    summary = summarise(rows, profile, profile_path.name, rows[0]["dtype"], old["torch_version"])
    summary["measured_utc"] = old.get("measured_utc", old["created_utc"])
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def write_csv(path: Path, fields, rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def _dtypes(device: str, dtype: str) -> list[str]:
    """The step dtype first (it sets gemm_efficiency), then the device's usual others."""
    others = ("fp16", "bf16", "fp32") if device == "cuda" else ()
    return [dtype, *(other for other in others if other != dtype)]


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{1e3 * seconds:.2f}ms"


def print_table(summary: dict) -> None:
    print(f"{'model':<24} {'recipe':<16} {'params':>9} {'batch':>5} {'measured':>10} {'GPU busy':>10} "
          f"{'profile':>10} {'err':>7} {'datasheet':>10} {'err':>7}")
    for row in summary["rows"]:
        print(f"{row['model']:<24} {row['recipe']:<16} {row['num_params'] / 1e6:>8.1f}M {row['batch_size']:>5} "
              f"{1e3 * row['measured_step_s']:>8.2f}ms {_ms(row['measured_gpu_busy_s']):>10} "
              f"{1e3 * row['predicted_profile_s']:>8.2f}ms "
              f"{row['error_profile_pct']:>+6.1f}% {1e3 * row['predicted_datasheet_s']:>8.2f}ms "
              f"{row['error_datasheet_pct']:>+6.1f}%")
    for recipe, mape in summary["mape_by_recipe_pct"].items():
        print(f"MAPE {recipe}: measured kernel profile {mape['profile']:.1f} %, datasheet {mape['datasheet']:.1f} %")
    print(f"MAPE: measured kernel profile {summary['mape_profile_pct']:.1f} %, datasheet "
          f"{summary['mape_datasheet_pct']:.1f} % ({summary['gpu']}, {summary['device']['name']}, {summary['dtype']})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--out", metavar="DIR", help="folder for the profile, steps.csv, kernels.csv (CUDA), summary.json")
    parser.add_argument("--repredict", metavar="DIR", default=None,
                        help="re-predict the check committed in DIR with this simulator (no device needed)")
    parser.add_argument("--gpu", default=None, help="catalogue GPU of the datasheet figures (default: detected)")
    parser.add_argument("--dtype", choices=tuple(TORCH_DTYPES), default=None,
                        help="training dtype (default bf16 on cuda, fp32 on cpu)")
    parser.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="adam")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks of steps per model (median)")
    parser.add_argument("--quick", action="store_true", help="the kernel calibration's tiny sizes (tests)")
    parser.add_argument("--profile", default=None, help="reuse this kernel profile instead of calibrating")
    parser.add_argument("--recipes", default=",".join(RECIPES),
                        help=f"comma-separated training recipes of each model (of {', '.join(RECIPES)})")
    args = parser.parse_args(argv)
    args.recipes = [recipe.strip() for recipe in args.recipes.split(",") if recipe.strip()]
    unknown = [recipe for recipe in args.recipes if recipe not in RECIPES]
    if unknown or not args.recipes:
        parser.error(f"--recipes: {','.join(unknown) or 'none given'}: expected some of {', '.join(RECIPES)}")
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats} must be at least 1")
    if not args.out and not args.repredict:
        parser.error("--out: required (or --repredict DIR)")
    try:
        summary = repredict(Path(args.repredict)) if args.repredict else check(args)
    except ScenarioError as error:
        print(f"gpu_kernel_check: error: {error}", file=sys.stderr)
        return 2
    print_table(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
