"""`ghpsim import-model`: the simulator's layer limit, what the table is for, recurrent layers, grammar.

* A model of more than `simulator.limits.MAX_LAYERS` rows used to be written, and `ghpsim simulate`
  then refused the table: it is refused up front (exit 2, one line, no file).
* The table has no torch specs, so calibrate / validate refuse it: the success line and the --json
  output say so.
* An nn.LSTM / GRU / RNN row used to be `elementwise`: it is `linear`, with the recurrent closed form
  as its FLOPs (`validator.import_model_kinds`).
* "wrote 1 layers": one layer is singular.
The factories below are imported by target ("tests.test_import_model_limits:...").
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

from ghpsim.cli import main
from simulator.errors import ScenarioError
from simulator.limits import MAX_LAYERS
from simulator.model_source import load_layer_table
from validator.import_model import import_model
from validator.import_model_kinds import recurrent_flops
from validator.models import check_torch_specs

HERE = "tests.test_import_model_limits"
SEQ, FEATURES, HIDDEN = 10, 8, 16


def relus(count: int = MAX_LAYERS + 1) -> nn.Module:
    return nn.Sequential(*(nn.ReLU() for _ in range(count)))


def listed_relus(count: int = MAX_LAYERS) -> nn.Module:
    """The rows come from a ModuleList the forward walks, and a head: count + 1 rows."""
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.ReLU() for _ in range(count))
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)
    return Stack()


def one_linear() -> nn.Module:
    return nn.Linear(4, 2)


class Recurrent(nn.Module):
    """A projection, a recurrent layer (its output sequence only) and a head."""

    def __init__(self, cls=nn.LSTM, **options):
        super().__init__()
        self.proj = nn.Linear(FEATURES, HIDDEN)
        self.rnn = cls(HIDDEN, HIDDEN, batch_first=True, **options)
        out = self.rnn.proj_size or HIDDEN
        self.head = nn.Linear(out * (2 if self.rnn.bidirectional else 1), 4)

    def forward(self, x):
        y, _ = self.rnn(self.proj(x))
        return self.head(y)


def recurrent(cls: str = "LSTM", num_layers: int = 1, bidirectional: bool = False, proj_size: int = 0):
    options = {"proj_size": proj_size} if proj_size else {}
    return Recurrent(getattr(nn, cls), num_layers=num_layers, bidirectional=bidirectional, **options)


class CellLoop(nn.Module):
    """An LSTMCell stepped over the sequence in a Python loop (one row, SEQ calls)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(FEATURES, HIDDEN)

    def forward(self, x):
        h = c = torch.zeros(x.shape[0], HIDDEN, device=x.device)
        for step in range(x.shape[1]):
            h, c = self.cell(x[:, step], (h, c))
        return h


def cell_loop():
    return nn.Sequential(CellLoop(), nn.Linear(HIDDEN, 4))


# --- 1: at most MAX_LAYERS rows ------------------------------------------------------------------

@pytest.mark.parametrize("factory", ["relus", "listed_relus"])
def test_more_layers_than_the_simulator_takes_are_refused(factory):
    with pytest.raises(ScenarioError) as info:
        import_model(f"{HERE}:{factory}", (4,))
    message = str(info.value)
    assert "\n" not in message and f"{MAX_LAYERS + 1:,} layers" in message and f"{MAX_LAYERS:,}" in message
    assert MAX_LAYERS == 2_048  # the message's figure is the simulator's own limit


def test_the_most_layers_the_simulator_takes_are_imported_and_load(tmp_path):
    document = import_model(f"{HERE}:relus", (4,), kwargs={"count": MAX_LAYERS})
    assert len(document["layers"]) == MAX_LAYERS
    path = tmp_path / "relus.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    assert load_layer_table(path).num_layers == MAX_LAYERS
    document["layers"].append({**document["layers"][-1], "name": "one_more"})
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(ScenarioError, match="2049 layers"):  # the limit the refusal above keeps to
        load_layer_table(path)


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_the_command_refuses_too_many_layers_in_one_line_and_writes_nothing(tmp_path, capsys, json_flag):
    out = tmp_path / "table.yaml"
    code = main(["import-model", f"{HERE}:relus", "--input-shape", "4", "--out", str(out), *json_flag])
    captured = capsys.readouterr()
    assert code == 2 and not out.exists() and list(tmp_path.iterdir()) == []
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ghpsim: error:") and "Traceback" not in captured.err
    assert "2,049 layers" in lines[0] and "2,048" in lines[0]
    assert "wrote" not in captured.out


# --- 2 and 4: the success line -------------------------------------------------------------------

def success_line(capsys, factory: str, shape: str, out) -> str:
    assert main(["import-model", f"{HERE}:{factory}", "--input-shape", shape, "--out", str(out)]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_the_success_line_says_what_the_table_is_for(tmp_path, capsys):
    line = success_line(capsys, "one_linear", "4", tmp_path / "one.yaml")
    assert "simulate/compare/rank" in line and "not calibrate/validate" in line


def test_one_layer_is_written_in_the_singular(tmp_path, capsys):
    out = tmp_path / "table.yaml"
    assert success_line(capsys, "one_linear", "4", out).startswith(f"wrote 1 layer to {out}")
    assert success_line(capsys, "recurrent", f"{SEQ},{FEATURES}", out).startswith(f"wrote 3 layers to {out}")


def test_the_json_output_says_the_validator_cannot_run_the_table(tmp_path, capsys):
    out = tmp_path / "one.yaml"
    assert main(["import-model", f"{HERE}:one_linear", "--input-shape", "4", "--out", str(out), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written == {"out": str(out), "name": "one_linear", "layers": 1, "runnable_by_validator": False}
    with pytest.raises(ScenarioError, match="simulated but not calibrated or validated"):
        check_torch_specs(load_layer_table(out))  # what calibrate / validate check: the field is true


# --- 3: recurrent layers -------------------------------------------------------------------------

def closed_form(gates: int, num_layers: int = 1, directions: int = 1, proj: int = 0) -> int:
    """gates x (input + fed back) x hidden x 2 per token, layer and direction (+ LSTMP's projection)."""
    fed_back = proj or HIDDEN
    total = 0
    for layer in range(num_layers):
        inputs = HIDDEN if layer == 0 else directions * fed_back
        total += directions * 2 * (gates * (inputs + fed_back) * HIDDEN + (fed_back * HIDDEN if proj else 0))
    return SEQ * total


@pytest.mark.parametrize("options, expected", [
    ({"cls": "LSTM"}, SEQ * 4 * (HIDDEN + HIDDEN) * HIDDEN * 2),  # by hand: 4 gates x (in + hidden) x hidden x 2
    ({"cls": "GRU"}, closed_form(3)),
    ({"cls": "RNN"}, closed_form(1)),
    ({"cls": "LSTM", "num_layers": 2, "bidirectional": True}, closed_form(4, 2, 2)),
    ({"cls": "LSTM", "num_layers": 2, "proj_size": 8}, closed_form(4, 2, 1, 8)),
    ({"cls": "GRU", "num_layers": 3}, closed_form(3, 3)),
])
def test_a_recurrent_layer_is_linear_with_the_closed_form_flops(options, expected):
    rows = import_model(f"{HERE}:recurrent", (SEQ, FEATURES), kwargs=options)["layers"]
    assert [row["name"] for row in rows] == ["proj", "rnn", "head"]
    rnn = rows[1]
    assert rnn["kind"] == "linear"
    assert rnn["forward_flops_per_sample"] == expected
    assert rnn["backward_flops_per_sample"] == 2 * expected
    assert rows[0]["forward_flops_per_sample"] == 2 * FEATURES * HIDDEN * SEQ  # the other rows are untouched


def test_a_cell_stepped_in_a_loop_counts_every_step():
    rows = import_model(f"{HERE}:cell_loop", (SEQ, FEATURES))["layers"]
    assert [row["kind"] for row in rows] == ["linear", "linear"]
    # the loop's slicing and zeros count nothing; the cell's own ops are replaced by the closed form
    assert rows[0]["forward_flops_per_sample"] == SEQ * 4 * (FEATURES + HIDDEN) * HIDDEN * 2


def test_recurrent_flops_of_a_packed_sequence_counts_its_tokens():
    lstm = nn.LSTM(FEATURES, HIDDEN)
    packed = nn.utils.rnn.pack_sequence([torch.zeros(3, FEATURES), torch.zeros(2, FEATURES)])
    assert recurrent_flops(lstm, (packed,), {}) == 5 * 4 * (FEATURES + HIDDEN) * HIDDEN * 2
    assert recurrent_flops(nn.Linear(2, 2), (torch.zeros(1, 2),), {}) is None
