"""The committed GPU validation (reports/validation_cuda.csv, measured on an H200 with the ranks
sharing it over gloo) is what the committed CUDA profiles predict: every predicted figure in the
report is reproduced from reports/profiles/<model>_ws<N>_cuda.json by the simulator here, and
every error is (predicted - measured) / measured. Each row is predicted with the partition its run
played (its `partition` column). Guards the report against a profile or a model
change that would leave its figures stale (after a model change: `benchmarks/repredict.py CSV
--write "what changed"` re-predicts a committed run from its own profiles)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from simulator.scenario import load_scenario
from validator.measure import RunOptions
from validator.validate import predicted_as_run

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "reports" / "validation_cuda.csv"


def _report() -> pd.DataFrame:
    return pd.read_csv(REPORT)


def test_report_covers_three_models_both_world_sizes_and_every_strategy():
    frame = _report()
    assert sorted(frame["model"].unique()) == ["mlp_cpu", "resnet_cpu", "transformer_cpu"]
    for (model, world_size), group in frame.groupby(["model", "world_size"]):
        kinds = sorted(label.split()[0] for label in group["strategy"])
        assert kinds == (["dp", "ghp", "mp"] if world_size == 4 else ["dp", "mp"]), (model, world_size)


@pytest.mark.parametrize("world_size", [2, 4])
def test_profiles_record_the_gpu_and_the_shared_gloo_backend(world_size):
    for model in ("mlp_cpu", "resnet_cpu", "transformer_cpu"):
        profile = json.loads((ROOT / "reports" / "profiles" / f"{model}_ws{world_size}_cuda.json").read_text())
        assert profile["device"]["kind"] == "cuda" and "H200" in profile["device"]["name"]
        assert profile["backend"] == "gloo" and profile["world_size"] == world_size
        assert "+cu" in profile["provenance"]["torch_version"]


def test_every_predicted_figure_is_reproduced_from_the_committed_profile():
    frame = _report()
    for (model, world_size), group in frame.groupby(["model", "world_size"]):
        scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{model}.yaml",
                                 [f"cluster.gpus_per_node={world_size}"])
        profile = ROOT / "reports" / "profiles" / f"{model}_ws{world_size}_cuda.json"
        options = RunOptions(optimizer=scenario.training.optimizer)
        for row in group.itertuples():
            spec = (row.kind, row.num_groups if row.kind == "ghp" else None)
            assert predicted_as_run(scenario, str(profile), spec, row.partition, options) == \
                pytest.approx(row.predicted_s, rel=1e-9)
            assert row.error_pct == pytest.approx(100 * (row.predicted_s - row.measured_s) / row.measured_s, rel=1e-6)


PIPELINE_REPORT = ROOT / "reports" / "validation_pipelines_cuda.csv"


def test_pipeline_report_covers_every_schedule_at_two_and_four_stages():
    frame = pd.read_csv(PIPELINE_REPORT)
    assert sorted(frame["model"].unique()) == ["mlp_cpu", "resnet_cpu", "transformer_cpu"]
    for (model, stages), group in frame.groupby(["model", "world_size"]):
        kinds = {label.split(":")[0] for label in group["kind"]}
        assert {"gpipe", "1f1b", "pipedream", "spectrain"} <= kinds, (model, stages)
        assert stages in (2, 4)
    if "repredicted" in frame:  # a run re-predicted after a model change says with what
        assert frame["repredicted"].notna().all() and (frame["repredicted"].str.len() > 0).all()


H100_PIPELINE_REPORT = ROOT / "reports" / "gpu" / "h100_p2" / "validation_pipelines_h100_ws2_cuda.csv"
"""The fresh 2-stage run on an H100, its profiles beside it."""
H200_P4_PIPELINE_REPORT = ROOT / "reports" / "gpu" / "h200_p4" / "validation_pipelines_h200_ws4_cuda.csv"
"""The fresh 4-stage run on an H200, its profiles beside it."""


@pytest.mark.parametrize("report, profiles, device_name", [
    (PIPELINE_REPORT, ROOT / "reports" / "profiles", "H200"),
    (H100_PIPELINE_REPORT, H100_PIPELINE_REPORT.parent, "H100"),
    (H200_P4_PIPELINE_REPORT, H200_P4_PIPELINE_REPORT.parent, "H200"),
])
def test_every_pipeline_prediction_is_reproduced_from_the_committed_gpu_profile(report, profiles, device_name):
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_pipeline_validation import VIRTUAL_STAGES, pipeline_overrides, pipeline_profile
    frame = pd.read_csv(report)
    for (model, stages), group in frame.groupby(["model", "world_size"]):
        scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{model}.yaml",
                                 pipeline_overrides(stages) + [VIRTUAL_STAGES])
        profile = pipeline_profile(model, stages, profiles, suffix="_cuda")
        document = json.loads(profile.read_text())
        assert document["device"]["kind"] == "cuda" and device_name in document["device"]["name"]
        for row in group.itertuples():
            assert predicted_as_run(scenario, str(profile), (row.kind, None), row.partition,
                                    RunOptions(optimizer="momentum")) == pytest.approx(row.predicted_s, rel=1e-9)
            assert row.error_pct == pytest.approx(100 * (row.predicted_s - row.measured_s) / row.measured_s, rel=1e-6)


def test_h100_run_covers_every_schedule_of_the_three_models_at_two_stages():
    frame = pd.read_csv(H100_PIPELINE_REPORT)
    assert sorted(frame["model"].unique()) == ["mlp_cpu", "resnet_cpu", "transformer_cpu"]
    assert set(frame["world_size"]) == {2}
    for model, group in frame.groupby("model"):
        assert sorted(kind.split(":")[0] for kind in group["kind"]) == sorted(
            ["gpipe", "1f1b", "interleaved_1f1b", "pipedream", "spectrain"]), model


def test_h200_run_covers_the_schedules_each_model_takes_at_four_stages():
    """Interleaving (v = 2) needs 2p layers: at 4 stages only ResNet-20 has eight; the benchmark
    leaves it out for the MLP and the transformer."""
    frame = pd.read_csv(H200_P4_PIPELINE_REPORT)
    assert set(frame["world_size"]) == {4}
    kinds = {model: sorted(kind.split(":")[0] for kind in group["kind"]) for model, group in frame.groupby("model")}
    assert kinds == {"mlp_cpu": ["1f1b", "gpipe", "pipedream", "spectrain"],
                     "resnet_cpu": ["1f1b", "gpipe", "interleaved_1f1b", "pipedream", "spectrain"],
                     "transformer_cpu": ["1f1b", "gpipe", "pipedream", "spectrain"]}
