"""Measured peak memory of single-GPU training against the memory model (issue 74, point 2): small
GPT and LLaMA models of the simulator's zoo trained for real in Megatron's mixed precision, their
`torch.cuda.max_memory_allocated` over one step set beside the simulator's predicted peak.

    python3 benchmarks/gpu_memory_check.py --device cuda --out reports/gpu/memory_check
    python3 benchmarks/gpu_memory_check.py --device cpu --out /tmp/memory_check   # seconds (tests)

The recipe is the one the memory model describes for `strategy.kind: megatron` under bf16
(`simulator.memory_buffers`; Megatron-LM's Float16OptimizerWithFloat16Params and its DDP buffer):
- bf16 parameters (the validator's modules of the zoo model, `gpu_kernel_check.tied_model`);
- an fp32 main-gradient buffer per parameter, into which each bf16 gradient is added as soon as
  autograd has accumulated it, the bf16 gradient then freed (a post-accumulate-grad hook);
- fp32 master weights whose `.grad` is that buffer, updated by Adam with fp32 moments as one fused
  kernel per tensor list (torch's `fused=True`: no full-size temporaries, as apex's and
  TransformerEngine's multi-tensor Adam), then copied back into the bf16 parameters.
Explicit attention (scores, mask, softmax, context: `validator.attention_core`), so the scenario
has `costs.flash_attention: false`; no recompute; no dropout (the validator's modules have none,
so the GPT configurations say `dropout: 0`; LLaMA has none).

Measured: after two warm-up steps (gradients and optimizer state exist), the peak of live tensor
bytes over one step, forward to parameter copy-back, the step's batch included:
`torch.cuda.max_memory_allocated` on CUDA (caching-allocator slack not counted, as the model
counts none); on CPU the live bytes at the step's start plus the peak of the CPU allocator's running
total from torch.profiler's memory events (`validator.memory_measure`). Predicted: the simulator's
peak of the one device (`summary["devices"][0]["peak_memory_bytes"]`) for the same model, batch,
dtype and optimizer on the catalogue GPU (`--gpu`, default H200). Also printed: the persistent
bytes (parameters, main gradients, master weights, moments) measured and predicted.

Writes into --out: memory.csv (one row per model) and summary.json (device, torch, mean |error|).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from gpu_kernel_check import config_of, configs, tied_model  # noqa: E402
from simulator.errors import ScenarioError  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402
from simulator.simulate import simulate  # noqa: E402
from validator.memory_measure import measured_step_peak_bytes, tensor_bytes  # noqa: E402
from validator.models import loss_fn, make_batch  # noqa: E402

CONFIGS = {
    "cuda": configs(("gpt2-small", 8), ("gpt-24x1024-s1024", 4), ("llama-8x2048-gqa4-s2048", 4),
                    ("llama-16x4096-gqa8-s2048", 2)),
    "cpu": configs(("gpt-2x64-s32", 4), ("llama-2x64-gqa2-s32", 4)),
}
DTYPE = "bf16"
FIELDS = ("model", "params", "num_params", "batch_size", "dtype", "measured_peak_bytes", "predicted_peak_bytes",
          "error_pct", "measured_persistent_bytes", "predicted_persistent_bytes", "predicted_activation_bytes")
PERSISTENT = ("weights", "master_weights", "optimizer_state", "weight_gradients")


class MegatronMixedPrecision:
    """bf16 parameters, fp32 main gradients and master weights, fused Adam (module docstring)."""

    def __init__(self, model: torch.nn.Module, lr: float = 1e-4):
        self.params = list(model.parameters())
        self.main_grads = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        self.masters = [p.detach().float().clone() for p in self.params]
        for master, main_grad in zip(self.masters, self.main_grads):
            master.grad = main_grad
        self.adam = torch.optim.Adam(self.masters, lr=lr, fused=True)
        for param, main_grad in zip(self.params, self.main_grads):
            param.register_post_accumulate_grad_hook(self._accumulator(main_grad))

    @staticmethod
    def _accumulator(main_grad: torch.Tensor):
        def accumulate(param: torch.Tensor) -> None:
            main_grad.add_(param.grad)
            param.grad = None
        return accumulate

    def step(self) -> None:
        self.adam.step()
        with torch.no_grad():
            for param, master in zip(self.params, self.masters):
                param.copy_(master)
        for main_grad in self.main_grads:
            main_grad.zero_()

    def persistent(self) -> list[torch.Tensor]:
        tensors = self.params + self.main_grads + self.masters
        for state in self.adam.state.values():
            tensors += [value for value in state.values() if torch.is_tensor(value) and value.dim() > 0]
        return tensors


def measure_peak(workload, batch_size: int, device: str, warmup: int = 2) -> tuple[float, float]:
    """(peak bytes over one step, persistent bytes at its start) of the recipe above."""
    model = tied_model(workload, device, DTYPE)
    optimizer = MegatronMixedPrecision(model)
    inputs, targets = (tensor.to(device) for tensor in make_batch(workload, batch_size))

    def step() -> None:
        loss_fn(workload, model(inputs), targets).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    gc.collect()
    persistent = float(tensor_bytes(optimizer.persistent()))
    batch = 0.0 if device == "cuda" else float(tensor_bytes([inputs, targets]))  # alive before the CPU profile
    peak = measured_step_peak_bytes(step, device, persistent + batch)
    del model, optimizer, inputs, targets
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return peak, persistent


def scenario_for(label: str, zoo_name: str, params: dict, batch_size: int, gpu: str):
    return scenario_from_dict({
        "name": label, "cluster": {"num_nodes": 1, "gpus_per_node": 1, "gpu": gpu},
        "model": {"name": zoo_name, "params": params}, "strategy": {"kind": "megatron"},
        "training": {"global_batch_size": batch_size, "dtype": DTYPE, "optimizer": "adam"},
        "costs": {"model": "kernel", "flash_attention": False}}, label)


def predicted_peak(label: str, gpu: str, workload=None) -> dict:
    """The simulator's one device (`summary["devices"][0]`: peak_memory_bytes, memory_breakdown_bytes)
    for configuration `label` of `CONFIGS`."""
    _, zoo_name, params, batch_size = config_of(CONFIGS, label)
    scenario = scenario_for(label, zoo_name, params, batch_size, gpu)
    workload = workload or resolve_workload(scenario.model, scenario.base_dir)
    return simulate(scenario, workload=workload).summary["devices"][0]


def check(args) -> dict:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ScenarioError("--device cuda: torch sees no GPU on this machine")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for label, zoo_name, params, batch_size in CONFIGS[args.device]:
        scenario = scenario_for(label, zoo_name, params, batch_size, args.gpu)
        workload = resolve_workload(scenario.model, scenario.base_dir)
        print(f"[memory] {label}: {workload.num_params / 1e6:.1f} M parameters, batch {batch_size}",
              file=sys.stderr, flush=True)
        try:
            measured, persistent = measure_peak(workload, batch_size, args.device)
        except torch.cuda.OutOfMemoryError:
            print(f"[memory] {label}: out of GPU memory, skipped", file=sys.stderr, flush=True)
            gc.collect()
            torch.cuda.empty_cache()
            continue
        device = predicted_peak(label, args.gpu, workload)
        breakdown = device["memory_breakdown_bytes"]
        predicted = device["peak_memory_bytes"]
        rows.append({"model": label, "params": json.dumps(params or {"zoo": zoo_name}),
                     "num_params": workload.num_params, "batch_size": batch_size, "dtype": DTYPE,
                     "measured_peak_bytes": measured, "predicted_peak_bytes": predicted,
                     "error_pct": 100.0 * (predicted - measured) / measured,
                     "measured_persistent_bytes": persistent,
                     "predicted_persistent_bytes": sum(breakdown.get(key, 0.0) for key in PERSISTENT),
                     "predicted_activation_bytes": breakdown.get("activations", 0.0)})
        with (out / "memory.csv").open("w", newline="") as handle:  # after every model: a cut run keeps its rows
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    errors = [abs(row["error_pct"]) for row in rows]
    summary = {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "gpu": args.gpu,
        "torch_version": torch.__version__, "dtype": DTYPE,
        "mean_abs_error_pct": statistics.fmean(errors) if errors else None,
        "worst_abs_error_pct": max(errors) if errors else None, "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def print_table(summary: dict) -> None:
    mib = 2**20
    print(f"{'model':<26} {'params':>9} {'batch':>5} {'measured':>12} {'predicted':>12} {'err':>7} "
          f"{'persistent measured/predicted':>30}")
    for row in summary["rows"]:
        print(f"{row['model']:<26} {row['num_params'] / 1e6:>8.1f}M {row['batch_size']:>5} "
              f"{row['measured_peak_bytes'] / mib:>9.1f}MiB {row['predicted_peak_bytes'] / mib:>9.1f}MiB "
              f"{row['error_pct']:>+6.1f}% {row['measured_persistent_bytes'] / mib:>16.1f} / "
              f"{row['predicted_persistent_bytes'] / mib:.1f} MiB")
    if summary["rows"]:
        print(f"peak memory: mean |error| {summary['mean_abs_error_pct']:.1f} %, worst "
              f"{summary['worst_abs_error_pct']:.1f} % ({summary['device']}, {summary['dtype']}, Megatron mixed precision)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for memory.csv and summary.json")
    parser.add_argument("--gpu", default="H200", help="catalogue GPU of the prediction (default H200)")
    args = parser.parse_args(argv)
    try:
        summary = check(args)
    except ScenarioError as error:
        print(f"gpu_memory_check: error: {error}", file=sys.stderr)
        return 2
    print_table(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
