"""simulator.unused_settings: a setting the scenario's own plan ignores gets a note on stderr naming
it, and the note is true (the prediction is the same without the setting); settings that count,
and every preset scenario, get none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator.scenario import load_scenario
from simulator.unused_settings import unused_settings

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "scenarios" / "demo.yaml")  # ghp on V100s: the kernel model
GPT2_3D = str(ROOT / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml")  # megatron
LLAMA_FSDP = str(ROOT / "scenarios" / "llama3_70b_fsdp_h100.yaml")  # megatron, fsdp_sharding full_shard
ANALYTIC = ["--set", "costs.model=analytic"]


def simulate_json(capsys, scenario: str, *overrides: str) -> tuple[dict, list[str]]:
    assert main(["simulate", scenario, "--json", *overrides]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), [line for line in captured.err.splitlines() if line]


@pytest.mark.parametrize("scenario, base, setting, phrase", [
    (DEMO, ["--set", "strategy.kind=dp", "--set", "strategy.num_groups=null"], "strategy.num_microbatches=8",
     "strategy.num_microbatches 8: not used by kind dp (pipeline kinds and megatron only)"),
    (DEMO, ["--set", "strategy.kind=mp", "--set", "strategy.num_groups=null"], "strategy.num_groups=4",
     "strategy.num_groups 4: not used by kind mp (dp: a group per GPU, mp: one group)"),
    (DEMO, [], "strategy.num_virtual_stages=2", "strategy.num_virtual_stages 2: not used by kind ghp"),
    (DEMO, [], "strategy.weight_stashing=false", "strategy.weight_stashing False: not used by kind ghp (pipedream only)"),
    (DEMO, [], "strategy.tp_comm_overlap=true", "strategy.tp_comm_overlap True: not used by kind ghp (kind megatron only)"),
    (DEMO, [], "strategy.compression_density=0.1", "used with strategy.gradient_compression topk only"),
    (DEMO, [], "strategy.horovod_cycle_time_s=0.005", "used with strategy.gradient_fusion horovod only"),
    (DEMO, ["--set", "strategy.gradient_fusion=horovod"], "strategy.bucket_size_bytes=1048576",
     "not used with strategy.gradient_fusion horovod"),
    (DEMO, ANALYTIC, "training.memory_format=nhwc",
     "training.memory_format nhwc: read by the kernel cost model only; this scenario is priced by the analytic roofline"),
    (DEMO, ANALYTIC, "training.cudnn_allow_tf32=false", "training.cudnn_allow_tf32 False: read by the kernel cost model only"),
    (DEMO, [], "costs.host_bandwidth_bytes_per_s=1e9", "used with training.offload_activations only"),
    (GPT2_3D, ["--set", "strategy.tp_degree=1"], "strategy.sequence_parallel=true",
     "strategy.sequence_parallel True: no TP group to split the sequence over at tp_degree 1"),
    (GPT2_3D, [], "strategy.weight_prediction=forward", "not used by kind megatron (spectrain only)"),
    (GPT2_3D, [], "strategy.zero1_gradient_reduce=allreduce",
     "used with kind megatron and strategy.zero_stage 1 only (got megatron, zero_stage 0)"),
    (DEMO, ["--set", "strategy.overlap_backward=false"], "strategy.bucket_size_bytes=1048576",
     "not used with strategy.overlap_backward false"),
    (LLAMA_FSDP, [], "strategy.collective=tree", "not used with strategy.fsdp_sharding full_shard"),
    (LLAMA_FSDP, [], "strategy.overlap_backward=false", "not used with strategy.fsdp_sharding full_shard"),
    (LLAMA_FSDP, ["--set", "strategy.fsdp_sharding=no_shard"], "strategy.bucket_size_bytes=1048576",
     "not used with strategy.fsdp_sharding no_shard (each FSDP unit is reduced on its own)"),
    (DEMO, [], "strategy.fsdp_sharding=no_shard", "strategy.fsdp_sharding no_shard: not used by kind ghp"),
    (DEMO, [], "costs.flash_attention=true", "costs.flash_attention True: the model has no attention layer to fuse"),
    (DEMO, [], "training.recompute=selective", "recomputes attention cores only, and the model has none"),
    (DEMO, ANALYTIC, "costs.efficiency={attention: 0.3}", "costs.efficiency attention: the model has no attention layer"),
    (DEMO, ["--set", "cluster.num_nodes=1", "--set", "strategy.kind=dp", "--set", "strategy.num_groups=null"],
     "cluster.nics_per_node=4",
     "cluster.nics_per_node 4: one node: no traffic leaves it"),
])
def test_an_ignored_setting_is_noted_and_changes_nothing(capsys, scenario, base, setting, phrase):
    without, notes = simulate_json(capsys, scenario, *base)
    assert notes == []
    with_it, notes = simulate_json(capsys, scenario, *base, "--set", setting)
    assert len(notes) == 1 and notes[0].startswith("ghpsim: note: ") and phrase in notes[0], notes
    assert with_it["step_time_s"] == without["step_time_s"]  # the note is true: the plan ignores it
    echoed = ("recompute",)  # the memory section names the recompute setting it was given
    assert {key: value for key, value in with_it["memory"].items() if key not in echoed} == \
        {key: value for key, value in without["memory"].items() if key not in echoed}
    assert with_it["devices"] == without["devices"]


def test_settings_the_plan_reads_get_no_note(capsys):
    for scenario, overrides in ((DEMO, ["strategy.kind=1f1b", "strategy.num_groups=1", "strategy.num_microbatches=8"]),
                                (DEMO, ["training.memory_format=nhwc"]),  # the kernel model reads it
                                (DEMO, ["training.offload_activations=true", "costs.host_bandwidth_bytes_per_s=1e9"]),
                                (GPT2_3D, ["strategy.num_microbatches=16"]),
                                (LLAMA_FSDP, ["strategy.fsdp_sharding=no_shard", "strategy.collective=tree"]),
                                (LLAMA_FSDP, ["strategy.fsdp_sharding=no_shard", "strategy.overlap_backward=false"])):
        _, notes = simulate_json(capsys, scenario, *(part for item in overrides for part in ("--set", item)))
        assert notes == [], (scenario, overrides, notes)


def test_a_calibrated_profile_prices_compute_so_cost_model_inputs_are_not_noted():
    scenario = load_scenario(DEMO, ["costs.model=analytic", "training.memory_format=nhwc"])
    assert len(unused_settings(scenario)) == 1 and unused_settings(scenario, priced_by_profile=True) == []


def test_params_beside_a_layer_table_are_noted():
    scenario = load_scenario(ROOT / "scenarios" / "custom_layers.yaml", ["model.params={seq_len: 4096}"])
    assert unused_settings(scenario) == ["model.params {'seq_len': 4096}: not used with a layer table "
                                         "(model.file fixes every dimension)"]


@pytest.mark.parametrize("path", sorted(str(p) for p in (ROOT / "scenarios").glob("*.yaml")), ids=lambda p: Path(p).name)
def test_no_preset_scenario_sets_what_it_ignores(path):
    assert unused_settings(load_scenario(path)) == []


def test_bad_input_gets_its_one_error_line_without_the_notes(capsys):
    overrides = ["strategy.kind=dp", "strategy.num_microbatches=8", "training.global_batch_size=3"]
    assert main(["simulate", DEMO, *(part for item in overrides for part in ("--set", item))]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ghpsim: error: ") and "global_batch_size: 3" in err[0], err


def test_a_long_value_is_quoted_short():
    scenario = load_scenario(ROOT / "scenarios" / "custom_layers.yaml", ["model.params={x: " + "A" * 5000 + "}"])
    (note,) = unused_settings(scenario)
    assert note.startswith("model.params {'x': 'AAA") and "..." in note and len(note) < 200
