"""Accuracy at cluster scale: published Megatron-LM iteration times on up to 3,072 A100 GPUs (and on
V100), predicted with the datasheet catalogue (or a kernel profile) and scored against the measurements.

Three published tables on A100, GPT models with sequence 2,048, vocabulary 51,200, fp16 mixed precision
with Adam, on Selene (DGX A100 80 GB nodes: NVSwitch inside, 8 HDR InfiniBand NICs a node on a
rail-optimised fat-tree), and one on V100:

- `SC21_RUNS`: the ten weak-scaling runs of Narayanan et al., "Efficient Large-Scale Language
  Model Training on GPU Clusters Using Megatron-LM", SC'21, Table 1 (1.7B on 32 GPUs to 1T on
  3,072), full activation recomputation. Each run's tensor, pipeline and data degrees,
  micro-batch, global batch, interleaving (layers per virtual stage) and data-parallel
  implementation come from the authors' artifact, NVIDIA/Megatron-LM
  `examples/sc21/run_table_1.sh`: `DDP=torch` reduces gradient buckets during the backward
  (`overlap_backward: true`), `DDP=local` after it (`false`). The published figure is model
  TFLOP/s per GPU computed with the paper's eq. 3, F = 96 B s l h^2 (1 + s / 6h + V / 16lh) per
  iteration (recomputation included), so the measured iteration time is F / (GPUs x TFLOP/s). The
  table rounds TFLOP/s to three digits (at most 0.4 % of a row).
- `RECOMPUTE_RUNS`: the eight end-to-end iteration times of Korthikanti et al., "Reducing
  Activation Recomputation in Large Transformer Models", MLSys 2023, Table 5: 22B, 175B, 530B and
  1T on 8 to 512 GPUs without data parallelism, each with full recomputation and with selective
  recomputation plus sequence parallelism. Layouts (TP, PP, micro-batch, batch, interleaving) as
  transcribed with the measured seconds in calculon-ai/calculon (Isaev et al. SC'23)
  `calculon/megatron/validation.py` and `validation/*.json`.
- `V1_RUNS`: Megatron-LM v1.0 on V100 (NVIDIA ADLR, "MegatronLM's Supercharged V1.0", 2020, Table
  1): iteration times of GPT-2 models at batch 8, sequence 1,024, on one DGX-2H (V100 32 GB on
  NVSwitch; the `V100` preset, whose 125 TFLOP/s peak is 4 % under the DGX-2H's 130), one
  model-parallel group, no data parallelism. The rows whose model is the one of the same size in
  Shoeybi et al. 2019 Table 1 (1.2B: hidden 1,536, 16 heads, 40 layers; 4.2B: 2,304, 24, 64):
  the blog's 2.0B and 8.7B models are not described.
- `MT_NLG_RUNS`: Megatron-Turing NLG 530B (Smith et al., "Using DeepSpeed and Megatron to Train
  Megatron-Turing NLG 530B", arXiv 2201.11990, 2022): 105 layers, hidden 20,480, 128 heads,
  sequence 2,048, global batch 1,920, micro-batch 1, TP 8 x PP 35 on 280, 350 and 420 DGX A100
  nodes of Selene, iteration times 60.1, 50.2 and 44.4 s (126, 121 and 113 TFLOP/s a GPU, which
  the paper's figures agree with through eq. 3 to 0.5 %). DeepSpeed's pipeline engine runs 1F1B
  without interleaving and reduces gradients after the backward; full activation recomputation and
  fp16 are assumed (the DeepSpeed mixed precision of 2021).

- `LLAMA3_RUNS`: LLaMA-3 405B (Llama Team, "The Llama 3 Herd of Models", arXiv 2407.21783, 2024,
  Table 4) on 8,192 and 16,384 H100 (8 a server on NVLink, RoCE 400 Gb/s a GPU in a three-layer
  Clos: `roce-400g`, `fat_tree`), 8,192-token sequences, 16M tokens a step, TP 8 x PP 16 x DP 64 /
  128, micro-batch 1: 430 and 400 TFLOP/s a GPU. The iteration time is F / (GPUs x TFLOP/s) with
  F = tokens x (6 N + 12 L h s) (PaLM's count, Chowdhery et al. 2022, App. B; N the preset's 405.9B):
  counting the causal attention half would make F, and these times, 3.9 % smaller. Settings the
  table does not give are `scenarios/llama3_405b_4d_h100.yaml`'s: interleaving (4 virtual stages),
  selective recompute, flash attention, the distributed optimizer. Table 4's 131,072-token row is
  left out: there the attention is 57 % of F, and the causal convention alone moves it by 29 %.
- `BLOOM_RUNS`: BLOOM 176B (BigScience, arXiv 2211.05100) on 48 Jean Zay nodes of 8 A100 80 GB (4
  Omni-Path 100 Gb/s links a node), Megatron-DeepSpeed TP 4 x PP 12 x DP 8, micro-batch 2, bf16,
  full recomputation: the training log's iteration at global batch 2048, 104.70 s (149.77 TFLOP/s),
  and the ramp-up's global batch 16 (one micro-batch a pipeline), 15.23 s, both quoted in
  bigscience-workshop/bigscience `train/tr11-176B-ml/README.md`. Settings from its `.slurm` script
  (`scenarios/bloom_176b_jean_zay.yaml`).

Nothing here is fitted: these rows are held out from every parameter of the model, including
those `ghpsim fit` chose on the single-node rows of `bench_published.py`. Prints each run's
measured and predicted iteration time and error, then MAPE, mean signed error and the worst row
per table and over both, and whether the predicted peak memory of every run fits the 80 GB it
trained on.

`--plot FILE.png` draws each run's prediction against its measurement, one colour per table
(`reports/published_scale_accuracy.png`).

    python benchmarks/bench_published_scale.py [--table sc21|recompute|v1|mtnlg|llama3|bloom|all]
                                               [--profile PROFILE.json]
                                               [--processes N] [--json] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.errors import ScenarioError  # noqa: E402
from accuracy_plots import add_report_options, pyplot, save  # noqa: E402
from simulator.fit_plot import predicted_against_measured  # noqa: E402
from simulator.output import check_figure_file  # noqa: E402

SEQUENCE, VOCABULARY = 2048, 51200


@dataclass(frozen=True)
class PublishedRun:
    """One published run: a row of SC'21 Table 1 with its settings from `run_table_1.sh`, or (with
    `published_s`) a row of Korthikanti et al. Table 5."""

    params_billion: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    tflops_per_gpu: float | None
    aggregate_pflops: float | None
    """SC'21's last column: a check of the row's transcription (= TFLOP/s x GPUs)."""
    micro_batch: int
    layers_per_virtual_stage: int | None
    overlap_backward: bool
    """DDP=torch: True; DDP=local: False."""
    recompute: str = "full"
    sequence_parallel: bool = False
    published_s: float | None = None
    """The measured iteration time where the table gives it (else from TFLOP/s)."""
    source: str | None = None
    """The table of a row that is neither SC'21's nor Table 5's (`TABLES`)."""
    sequence: int = SEQUENCE

    @property
    def table(self) -> str:
        return self.source or ("sc21" if self.published_s is None else "recompute")

    @property
    def label(self) -> str:
        mode = "" if self.table != "recompute" else (" full" if self.recompute == "full" else " sel+sp")
        size = "1T" if self.params_billion == 1000 else f"{self.params_billion:g}B"  # Table 5's name
        batch = f" batch {self.global_batch}" if self.table == "bloom" else ""
        return f"{size} t{self.tp} p{self.pp} on {self.gpus}{mode}{batch}"

    @property
    def virtual_stages(self) -> int:
        if self.layers_per_virtual_stage is None:
            return 1
        return self.layers // self.pp // self.layers_per_virtual_stage

    def iteration_flops(self) -> float:
        """SC'21 eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16lh); for LLaMA-3, PaLM's tokens x (6 N + 12 l h s)."""
        h, s, l = self.hidden, self.sequence, self.layers
        if self.table == "llama3":
            return self.global_batch * s * (6 * LLAMA3_405B_PARAMS + 12 * l * h * s)
        return 96 * self.global_batch * s * l * h * h * (1 + s / (6 * h) + VOCABULARY / (16 * l * h))

    def measured_s(self) -> float:
        if self.published_s is not None:
            return self.published_s
        return self.iteration_flops() / (self.gpus * self.tflops_per_gpu * 1e12)


SC21_RUNS = (
    PublishedRun(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 4.4, 16, None, True),
    PublishedRun(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 8.8, 16, None, True),
    PublishedRun(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 18.2, 16, None, True),
    PublishedRun(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 34.6, 8, None, True),
    PublishedRun(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 70.8, 4, None, False),
    PublishedRun(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 143.8, 2, 5, False),
    PublishedRun(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 227.1, 2, 5, False),
    PublishedRun(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 297.4, 1, 3, False),
    PublishedRun(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 410.2, 1, 1, False),
    PublishedRun(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 502.0, 1, None, False),
)


def _recompute_pair(params_billion: float, heads: int, hidden: int, layers: int, pp: int, batch: int,
                    micro_batch: int, layers_per_virtual_stage: int | None, full_s: float,
                    selective_s: float) -> tuple[PublishedRun, PublishedRun]:
    """One model of Korthikanti et al. Table 5 (TP 8, no data parallelism): full recomputation,
    and selective recomputation with sequence parallelism."""
    common = dict(params_billion=params_billion, heads=heads, hidden=hidden, layers=layers, tp=8, pp=pp,
                  gpus=8 * pp, global_batch=batch, tflops_per_gpu=None, aggregate_pflops=None,
                  micro_batch=micro_batch, layers_per_virtual_stage=layers_per_virtual_stage,
                  overlap_backward=False)
    return (PublishedRun(**common, published_s=full_s),
            PublishedRun(**common, recompute="selective", sequence_parallel=True, published_s=selective_s))


RECOMPUTE_RUNS = (
    *_recompute_pair(22, 64, 6144, 48, 1, 4, 4, None, 1.42, 1.10),
    *_recompute_pair(175, 96, 12288, 96, 8, 64, 1, 4, 18.13, 13.75),
    *_recompute_pair(530, 128, 20480, 105, 35, 280, 1, 1, 49.05, 37.83),
    *_recompute_pair(1000, 160, 25600, 128, 64, 512, 1, None, 94.42, 71.49),
)
V1_RUNS = tuple(PublishedRun(params, heads, hidden, layers, tp, 1, tp, 8, None, None, 8, None, False,
                              published_s=seconds, source="v1", sequence=1024)
                for params, heads, hidden, layers, tp, seconds in ((1.2, 16, 1536, 40, 1, 1.288),
                                                                   (4.2, 24, 2304, 64, 4, 1.357)))
MT_NLG_RUNS = tuple(PublishedRun(530, 128, 20480, 105, 8, 35, 8 * nodes, 1920, tflops, None, 1, None, False,
                                  published_s=seconds, source="mtnlg")
                    for nodes, seconds, tflops in ((280, 60.1, 126), (350, 50.2, 121), (420, 44.4, 113)))
LLAMA3_405B_PARAMS = 405_853_388_800
"""The `llama3-405b` preset's parameters (Meta's 405B; the preset matches published counts, tested)."""
LLAMA3_RUNS = tuple(PublishedRun(405, 128, 16384, 126, 8, 16, gpus, 2048, tflops, None, 1, None, True,
                                 recompute="selective", sequence_parallel=True, source="llama3", sequence=8192)
                    for gpus, tflops in ((8192, 430), (16384, 400)))
BLOOM_SCENARIO = ROOT / "scenarios" / "bloom_176b_jean_zay.yaml"
BLOOM_RUNS = tuple(PublishedRun(176, 112, 14336, 70, 4, 12, 384, batch, None, None, 2, None, False,
                                published_s=seconds, source="bloom", sequence=2048)
                   for batch, seconds in ((2048, 104.70), (16, 15.23)))
RUNS = SC21_RUNS + RECOMPUTE_RUNS + V1_RUNS + MT_NLG_RUNS + LLAMA3_RUNS + BLOOM_RUNS
TABLES = {"sc21": "Megatron-LM SC'21 Table 1 on A100", "recompute": "Korthikanti et al. Table 5 on A100",
          "v1": "Megatron-LM v1.0 on V100 (DGX-2H)", "mtnlg": "Megatron-Turing NLG 530B on A100 (DeepSpeed)",
          "llama3": "LLaMA-3 405B on H100 (Meta, Table 4)",
          "bloom": "BLOOM 176B on A100 (Megatron-DeepSpeed, Jean Zay)"}
SYSTEMS = {
    "A100": {"gpus_per_node": 8, "nics_per_node": 8, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100",
             "inter_node_link": "ib-hdr", "topology": "rail_optimized"},
    "V100": {"gpus_per_node": 16, "gpu": "V100", "intra_node_link": "nvswitch1-v100", "inter_node_link": "ib-edr"},
    "H100": {"gpus_per_node": 8, "nics_per_node": 8, "gpu": "H100-SXM", "intra_node_link": "nvlink4-h100",
             "inter_node_link": "roce-400g", "topology": "fat_tree"},
}
"""Selene's DGX A100 nodes; one DGX-2H (16 V100 on NVSwitch); Meta's Grand Teton H100 servers."""


def run_scenario(run: PublishedRun) -> dict:
    """The scenario document of one published run."""
    data_parallel = run.gpus // (run.tp * run.pp)
    if run.table == "bloom":  # the preset as trained, at the row's global batch
        from simulator.yaml_loading import load_yaml_text
        document = load_yaml_text(BLOOM_SCENARIO.read_text(), str(BLOOM_SCENARIO))
        document["strategy"]["num_microbatches"] = run.global_batch // (run.micro_batch * data_parallel)
        document["training"]["global_batch_size"] = run.global_batch
        return document
    strategy = {"kind": "megatron", "tp_degree": run.tp, "pp_degree": run.pp,
                "num_microbatches": run.global_batch // (run.micro_batch * data_parallel),
                "overlap_backward": run.overlap_backward, "partition": "uniform"}
    if run.virtual_stages > 1:
        strategy["num_virtual_stages"] = run.virtual_stages
    if run.sequence_parallel:
        strategy["sequence_parallel"] = True
    system = SYSTEMS[{"v1": "V100", "llama3": "H100"}.get(run.table, "A100")]
    per_node = min(run.gpus, system["gpus_per_node"])
    document = {
        "name": f"megatron_{run.table}_{run.params_billion:g}b",
        "cluster": {**system, "num_nodes": run.gpus // per_node, "gpus_per_node": per_node},
        "model": {"name": "transformer", "params": {"num_layers": run.layers, "hidden_size": run.hidden,
                                                    "num_heads": run.heads, "seq_len": run.sequence,
                                                    "vocab_size": VOCABULARY}},
        "strategy": strategy,
        "training": {"global_batch_size": run.global_batch, "dtype": "fp16", "optimizer": "adam",
                     "recompute": run.recompute},
    }
    if run.table == "llama3":  # the rest as `scenarios/llama3_405b_4d_h100.yaml` has it
        del strategy["partition"]
        strategy.update(zero_stage=1, num_virtual_stages=4)
        document.update(model={"name": "llama3-405b"}, costs={"flash_attention": True})
        document["training"]["dtype"] = "bf16"
    return document


def predict_s(args: tuple[PublishedRun, str | None]) -> tuple[float | str, float, bool, float]:
    """(predicted iteration seconds, or the one-line error; predicted peak memory per GPU in bytes;
    whether it fits the GPU's memory; wall seconds) of one run."""
    run, profile = args
    from simulator.model_source import resolve_workload
    from simulator.profile_costs import scenario_profile_costs
    from simulator.scenario import scenario_from_dict
    from simulator.simulate import simulate
    started = time.perf_counter()
    try:
        scenario = scenario_from_dict(run_scenario(run), str(ROOT))
        workload = resolve_workload(scenario.model, scenario.base_dir)
        costs = scenario_profile_costs(profile, scenario, workload) if profile else None
        summary = simulate(scenario, costs=costs, workload=workload).summary
        memory = summary["memory"]
        return (summary["step_time_s"], memory["peak_memory_bytes"], memory["fits_in_memory"],
                time.perf_counter() - started)
    except ScenarioError as error:
        return str(error), 0.0, False, time.perf_counter() - started


def score(rows: list[dict]) -> dict:
    """MAPE, mean signed error and worst |error| (percent) over the rows that simulated."""
    errors = [row["error_pct"] for row in rows if row.get("error_pct") is not None]
    if not errors:
        return {"runs": 0}
    worst = max((row for row in rows if row.get("error_pct") is not None), key=lambda row: abs(row["error_pct"]))
    return {"runs": len(errors), "mape_pct": statistics.fmean(abs(e) for e in errors),
            "mean_signed_pct": statistics.fmean(errors), "worst_pct": abs(worst["error_pct"]),
            "worst_run": worst["run"]}


def print_table(title: str, rows: list[dict]) -> None:
    print(title)
    print(f"{'run':34s} {'measured s':>11s} {'predicted s':>12s} {'error':>8s} {'peak GiB':>9s} {'sim s':>7s}")
    for row in rows:
        if row["predicted_s"] is None:
            print(f"{row['run']:34s} {row['measured_s']:11.3f}  not simulated: {row['error']}")
            continue
        print(f"{row['run']:34s} {row['measured_s']:11.3f} {row['predicted_s']:12.3f} "
              f"{row['error_pct']:+7.1f}% {row['peak_memory_bytes'] / 2**30:9.1f} {row['wall_s']:7.1f}")
    summary = score(rows)
    if summary["runs"]:
        print(f"{summary['runs']} runs: MAPE {summary['mape_pct']:.1f} %, mean signed {summary['mean_signed_pct']:+.1f} %, "
              f"worst {summary['worst_pct']:.1f} % ({summary['worst_run']})")


def write_accuracy_plot(rows: list[dict], path: Path) -> Path:
    """Predicted against measured seconds of every simulated run, one colour per table (its MAPE in
    the legend)."""
    figure, axis = pyplot().subplots(figsize=(6.5, 5.5))
    simulated = [row for row in rows if row["predicted_s"] is not None]
    for table, title in TABLES.items():
        part = [row for row in simulated if row["table"] == table]
        if part:
            axis.scatter([row["measured_s"] for row in part], [row["predicted_s"] for row in part], s=22,
                         label=f"{title}: MAPE {score(part)['mape_pct']:.1f} %")
    low = 0.7 * min(row["measured_s"] for row in simulated)
    high = 1.4 * max(row["measured_s"] for row in simulated)
    predicted_against_measured(axis, low, high, "s", "")
    axis.legend(fontsize=7, loc="upper left")
    return save(figure, path, "published large-model runs, nothing fitted", dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--table", choices=(*TABLES, "all"), default="all", help="which published table to score")
    parser.add_argument("--profile", default=None,
                        help="a kernel profile (`ghpsim fit`, `calibrate --kernels`); default: the datasheet catalogue")
    add_report_options(parser)
    args = parser.parse_args(argv)
    if args.profile and not Path(args.profile).is_file():
        print(f"bench_published_scale: error: --profile {args.profile}: no such file", file=sys.stderr)
        return 2
    if args.plot is not None:
        try:
            check_figure_file(args.plot, "--plot")
        except ScenarioError as error:
            print(f"bench_published_scale: error: {error}", file=sys.stderr)
            return 2
    runs = [run for run in RUNS if args.table in ("all", run.table)]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(max(1, args.processes)) as pool:
        # the largest first, so that the pool's last task is a short one
        order = sorted(range(len(runs)), key=lambda index: -runs[index].gpus * runs[index].global_batch)
        results = dict(zip(order, pool.map(predict_s, [(runs[index], args.profile) for index in order], chunksize=1)))
    rows = []
    for index, run in enumerate(runs):
        predicted, peak_bytes, fits, wall_s = results[index]
        row = {"run": run.label, "table": run.table, "measured_s": run.measured_s(), "peak_memory_bytes": peak_bytes,
               "fits_in_memory": fits, "wall_s": wall_s}
        if isinstance(predicted, str):
            row.update(predicted_s=None, error_pct=None, error=predicted)
        else:
            row.update(predicted_s=predicted, error_pct=100 * (predicted - row["measured_s"]) / row["measured_s"])
        rows.append(row)
    tables = [table for table in TABLES if any(row["table"] == table for row in rows)]
    if args.plot is not None and any(row["predicted_s"] is not None for row in rows):
        write_accuracy_plot(rows, args.plot)
    figures = {"model": args.profile or "datasheet", "rows": rows, "summary": score(rows),
               "tables": {table: score([row for row in rows if row["table"] == table]) for table in tables},
               "wall_s": time.perf_counter() - started}
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    for table in tables:
        print_table(f"{TABLES[table]}, {figures['model']}:", [row for row in rows if row["table"] == table])
        print()
    summary = figures["summary"]
    if summary["runs"] and len(tables) > 1:
        print(f"all {summary['runs']} runs: MAPE {summary['mape_pct']:.1f} %, mean signed {summary['mean_signed_pct']:+.1f} %, "
              f"worst {summary['worst_pct']:.1f} % ({summary['worst_run']})")
    over = [row["run"] for row in rows if row["predicted_s"] is not None and not row["fits_in_memory"]]
    print("predicted peak memory: every run fits its GPU's memory, as it did" if not over else
          f"predicted peak memory: {', '.join(over)} over the GPU's memory, though the published runs trained")
    print(f"({figures['wall_s']:.0f} s)")
    return 0 if summary["runs"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
