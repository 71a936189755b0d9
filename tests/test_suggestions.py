"""Suggestions for a mistyped preset or model name: the closest first, a name the typed text begins
(H100 -> H100-SXM, H100-PCIe) ahead of names that are merely similar (V100, H200)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator.errors import nearest_names
from simulator.hardware import GPUS, LINKS, resolve_gpu, resolve_link

DEMO = str(Path(__file__).resolve().parent.parent / "scenarios" / "demo.yaml")


def suggested(error: Exception) -> list[str]:
    return re.search(r"nearest: (.*)$", str(error)).group(1).split(", ")


@pytest.mark.parametrize("typed, first", [
    ("H100", ["H100-SXM", "H100-PCIe"]),
    ("h100", ["H100-SXM", "H100-PCIe"]),
    ("A100", ["A100-40GB", "A100-80GB"]),
    ("A100-80G", ["A100-80GB", "A100-80GB-PCIe"]),
    ("MI300", ["MI300X"]),
    ("V10", ["V100"]),
])
def test_gpu_names_the_typed_text_begins_come_first(typed, first):
    with pytest.raises(ValueError, match="unknown GPU preset") as error:
        resolve_gpu(typed)
    assert suggested(error.value)[:len(first)] == first


def test_h100_suggests_both_h100s_before_any_other():
    with pytest.raises(ValueError) as error:
        resolve_gpu("H100")
    names = suggested(error.value)
    assert names[:2] == ["H100-SXM", "H100-PCIe"] and len(names) <= 3


@pytest.mark.parametrize("typed, first", [
    ("ib-hdrr", "ib-hdr"),  # a name the typed text begins with
    ("nvlink4", "nvlink4-h100"),
    ("roce-400", "roce-400g"),
])
def test_link_suggestions_closest_first(typed, first):
    with pytest.raises(ValueError, match="unknown link preset") as error:
        resolve_link(typed)
    assert suggested(error.value)[0] == first


def test_containment_before_mere_similarity():
    assert nearest_names("sxm", ["SXM-like", "H100-SXM", "xsm"], cutoff=0.5)[:2] == ["SXM-like", "H100-SXM"]


def test_far_name_suggests_nothing_and_lookup_names_the_list_command():
    assert nearest_names("zzzzzzzz", GPUS) == []
    assert nearest_names("", LINKS) == []
    with pytest.raises(ValueError, match="`ghpsim list gpus` lists them"):
        resolve_gpu("zzzzzzzz")


def test_cli_set_gpu_h100_one_line_with_h100_sxm_first(capsys):
    code = main(["simulate", DEMO, "--set", "cluster.gpu=H100"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "cluster.gpu" in err and "'H100'" in err
    assert suggested(err.strip())[:2] == ["H100-SXM", "H100-PCIe"]


def test_model_names_closest_first(capsys):
    code = main(["simulate", DEMO, "--set", "model.name=llama3"])
    err = capsys.readouterr().err
    assert code == 2 and suggested(err.strip()) == ["llama3-8b", "llama3-70b", "llama3-405b"]
