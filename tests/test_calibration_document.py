"""`validator.calibration_document.loadable_document`: a calibration never writes a profile the
simulator refuses; an implausible optional measurement is left out with a note."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from simulator.errors import ScenarioError  # noqa: E402
from simulator.profile import profile_from_dict  # noqa: E402
from validator.calibration_document import loadable_document  # noqa: E402

PROFILE = (Path(__file__).resolve().parent.parent / "reports" / "diagnostics" / "confirmation_runs" / "s32_fresh"
           / "profiles" / "resnet_cpu_ws2_momentum.json")


@pytest.fixture
def document() -> dict:
    return json.loads(PROFILE.read_text())


def test_a_plausible_calibration_is_written_as_measured(document):
    before = copy.deepcopy(document)
    assert loadable_document(document, "p.json") == before


@pytest.mark.parametrize("section,field,value", [("cycle_compute", "efficiency", 2.86),
                                                 ("copy_backward", "factor", 40.0)])
def test_an_implausible_measured_section_is_left_out_with_a_note(document, section, field, value):
    document[section][field] = value
    checked = loadable_document(document, "p.json")
    assert section not in checked
    assert any(note.startswith(f"{section}.{field}: ") and repr(value) in note for note in checked["notes"])
    profile = profile_from_dict(checked, "p.json")
    assert getattr(profile, section) is None


def test_both_sections_implausible_leaves_both_out(document):
    document["cycle_compute"]["efficiency"] = 0.01
    document["copy_backward"]["factor"] = 0.001
    checked = loadable_document(document, "p.json")
    assert "cycle_compute" not in checked and "copy_backward" not in checked
    assert profile_from_dict(checked, "p.json").cycle_compute is None


def test_any_other_refusal_is_raised_not_written(document):
    document["layers"] = document["layers"][:-1]
    with pytest.raises(ScenarioError, match="p.json: layers: "):
        loadable_document(document, "p.json")
