"""Bad input to the validator's calibration and profiles, found by an audit: refused in one line
before any rank starts, naming the setting and the value."""

from __future__ import annotations

import os
import sys

import pytest

from simulator.errors import ScenarioError
from simulator.profile import load_profile, profile_from_dict
from tests.test_bad_input import run_cli
from tests.test_profile import document, workload

pytest.importorskip("torch")

from validator.calibrate import MAX_CALIBRATION_BATCH, calibrate  # noqa: E402
from validator.comm_device import RANKS_PER_CPU, device_problem  # noqa: E402


@pytest.fixture
def nothing_runs(monkeypatch):
    """Record (and refuse) every way a calibration, a validation or an import starts real work: the
    ranks' launch, the kernel benchmarks, the validation runs and the user's factory."""
    import validator.calibrate
    import validator.import_model
    import validator.kernel_bench
    import validator.validate

    started = []

    def refuse(name):
        def started_work(*args, **kwargs):
            started.append(name)
            raise AssertionError(f"{name} ran before the input was refused")
        return started_work

    for module, name in ((validator.calibrate, "spawn"), (validator.calibrate, "calibrate_kernels"),
                         (validator.kernel_bench, "measure"), (validator.validate, "validate"),
                         (validator.validate, "spawn"), (validator.import_model, "import_model")):
        monkeypatch.setattr(module, name, refuse(f"{module.__name__}.{name}"))
    return started


@pytest.mark.parametrize("backend, device, ranks, words", [
    ("mpi", "cpu", 2, "'mpi' is not one the validator runs"),
    ("nccl", "cpu", 2, "nccl runs on GPUs"),
    ("gloo", "cpu", RANKS_PER_CPU * (os.cpu_count() or 1) + 1, "ranks on"),
])
def test_device_problems_are_named_before_a_launch(backend, device, ranks, words):
    assert words in device_problem(device, backend, ranks)
    assert device_problem("cpu", "gloo", 2) is None


@pytest.mark.parametrize("settings, words", [
    (dict(backend="nccl"), "nccl runs on GPUs"),
    (dict(world_size=RANKS_PER_CPU * (os.cpu_count() or 1) + 1), "CPU cores"),
    (dict(batch_sizes=(2, MAX_CALIBRATION_BATCH + 1)), "batch_sizes"),
])
def test_calibrate_refuses_before_any_rank_starts(tmp_path, nothing_runs, settings, words):
    with pytest.raises(ScenarioError, match=words):
        calibrate(workload(), {}, tmp_path / "p.json", verbose=False, **settings)
    assert nothing_runs == [] and not (tmp_path / "p.json").exists()


def test_calibrate_checks_its_out_path_first(tmp_path, nothing_runs):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(ScenarioError, match="--out .*not a directory"):
        calibrate(workload(), {}, blocker / "p.json", verbose=False)
    assert nothing_runs == []


def test_a_profile_of_another_backend_is_refused():
    with pytest.raises(ScenarioError, match="backend"):
        profile_from_dict({**document(), "backend": "mpi"}, "p.json")


def test_a_newer_profile_format_is_called_newer(tmp_path):
    with pytest.raises(ScenarioError, match="is a newer profile format.* update ghpsim"):
        profile_from_dict({**document(), "format": "ghpsim-profile/99"}, "p.json")
    with pytest.raises(ScenarioError, match="is an older profile format"):
        profile_from_dict({**document(), "format": "ghpsim-profile/1"}, "p.json")
    with pytest.raises(ScenarioError, match="is a directory"):
        load_profile(tmp_path)


def test_import_model_turns_a_sys_exit_in_user_code_into_an_error(capsys, tmp_path, monkeypatch):
    (tmp_path / "exits_on_build.py").write_text("import sys\n\ndef factory():\n    sys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run_cli(capsys, "import-model", "exits_on_build:factory", "--input-shape", "8",
                     "--out", tmp_path / "x.yaml")
    code, _out, err = result
    assert code == 2 and "Traceback" not in err
    assert "the factory raised SystemExit: 3" in err.strip().splitlines()[-1]  # after the note on running user code
    assert not (tmp_path / "x.yaml").exists()
    sys.modules.pop("exits_on_build", None)


SCENARIO = "scenarios/validation/mlp_cpu.yaml"


@pytest.mark.parametrize("argv, words", [
    (("calibrate", "--scenario", SCENARIO, "--batch-sizes", ""), "--batch-sizes: '' has an empty item"),
    (("calibrate", "--scenario", SCENARIO, "--batch-sizes", "4,,16"), "--batch-sizes: '4,,16' has an empty item"),
    (("calibrate", "--kernels", "--world-size", "4"), "--world-size: not used with --kernels"),
    (("calibrate", "--kernels", "--dtypes", ","), "--dtypes ',': empty"),
    (("import-model", "tests.byo_models:tiny_mlp", "--input-shape", "3,,4"), "--input-shape: '3,,4' has an empty item"),
    (("validate", SCENARIO, "--profile", "reports/profiles/mlp_cpu_ws2.json", "--top", "3"),
     "--top 3: only with --rank"),
])
def test_empty_or_stray_flags_are_refused(capsys, tmp_path, nothing_runs, argv, words):
    code, _out, err = run_cli(capsys, *argv, "--out", tmp_path / "out")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert words in err, err
    assert nothing_runs == [] and not (tmp_path / "out").exists()
