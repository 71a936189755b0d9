"""`ghpsim import-model` refuses a model whose skip connections span several exported layers.

The simulator models a chain of layers (scenarios/README.md, 'Layer tables'): a stage boundary
carries one layer's output. A residual added across two or more exported layers, a branch reading
an earlier layer's output, or the input handed to a later layer used to be imported silently, the
skip dropped from the table. They are now refused in one line naming the layers (exit 2, no file
written); a skip inside one exported layer (a residual block module) stays accepted. The factories
below are imported by target ("tests.test_import_model_skips:...").
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ghpsim.cli import main
from simulator.errors import ScenarioError
from validator.import_model import import_model

HERE = "tests.test_import_model_skips"
WIDTH = 16


class ResidualAcrossTwo(nn.Module):
    """l1's output is added after l3: it skips l2 and l3."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x):
        h1 = self.l1(x)
        return self.head(self.l3(self.l2(h1)) + h1)


class Branches(nn.Module):
    """l2 and l3 both read l1's output (an Inception-like fork between exported layers)."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.head = nn.Linear(2 * WIDTH, 4)

    def forward(self, x):
        h1 = self.l1(x)
        return self.head(torch.cat([self.l2(h1), self.l3(h1)], dim=-1))


class TinyUNet(nn.Module):
    """The encoder's feature map is concatenated into the decoder's input, past two middle layers."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Conv2d(3, 4, 3, padding=1)
        self.middle1 = nn.Conv2d(4, 4, 3, padding=1)
        self.middle2 = nn.Conv2d(4, 4, 3, padding=1)
        self.decoder = nn.Conv2d(8, 2, 3, padding=1)

    def forward(self, x):
        skip = torch.relu(self.encoder(x))
        middle = torch.relu(self.middle2(torch.relu(self.middle1(skip))))
        return self.decoder(torch.cat([middle, skip], dim=1))


class InputReused(nn.Module):
    """The model's input is added after the second layer."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.l2(self.l1(x)) + x


class BasicBlock(nn.Module):
    """A ResNet basic block: its residual stays inside the module."""

    def __init__(self, channels: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + x)


class ResidualAroundOne(nn.Module):
    """A residual around one exported layer: its add is counted in l2's row, whose input h1 is."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x):
        h1 = self.l1(x)
        return self.head(self.l2(h1) + h1)


class ShapeOfTheInput(nn.Module):
    """Reads only the input's shape (and makes zeros like it) after the layers: no data skips."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = self.l2(self.l1(x))
        return h.reshape(x.shape[0], -1) + torch.zeros_like(x)


class LongResidual(nn.Module):
    """The input is added after eight layers of a ModuleList."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(8))

    def forward(self, x):
        h = x
        for layer in self.layers:
            h = layer(h)
        return h + x


def long_residual():
    return LongResidual()


def residual_across_two():
    return ResidualAcrossTwo()


def branches():
    return Branches()


def tiny_unet():
    return TinyUNet()


def input_reused():
    return InputReused()


def resnet_blocks():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), BasicBlock(), BasicBlock(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 10))


def residual_around_one():
    return ResidualAroundOne()


def shape_of_the_input():
    return ShapeOfTheInput()


REFUSED = {  # factory: (input shape, what the message must say)
    "residual_across_two": ((WIDTH,), "a tensor from the output of 'l1' skips 'l2', 'l3' to reach the ops after 'l3'"),
    "branches": ((WIDTH,), "a tensor from the output of 'l1' skips 'l2' to reach 'l3'"),
    "tiny_unet": ((3, 8, 8), "the output of 'encoder' skips 'middle1', 'middle2' to reach the ops after 'middle2'"),
    "input_reused": ((WIDTH,), "a tensor from the model's input skips 'l1', 'l2' to reach the ops after 'l2'"),
}


@pytest.mark.parametrize("factory", list(REFUSED))
def test_a_skip_across_exported_layers_is_refused_naming_them(factory):
    shape, fragment = REFUSED[factory]
    with pytest.raises(ScenarioError) as info:
        import_model(f"{HERE}:{factory}", shape)
    message = str(info.value)
    assert "\n" not in message and f"'{HERE}:{factory}'" in message
    assert "not a chain of layers" in message and fragment in message


def test_a_long_skip_names_its_ends_and_keeps_the_message_whole():
    with pytest.raises(ScenarioError) as info:
        import_model(f"{HERE}:long_residual", (WIDTH,))
    message = str(info.value)
    assert "the model's input skips 'layers.0', 'layers.1', ... 'layers.7' (8 layers) to reach the ops after " \
           "'layers.7'" in message
    assert message.endswith("(scenarios/README.md)")  # not cut at simulator.errors.MAX_MESSAGE_CHARS


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_the_command_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, json_flag):
    out = tmp_path / "table.yaml"
    code = main(["import-model", f"{HERE}:residual_across_two", "--input-shape", str(WIDTH), "--out", str(out),
                 *json_flag])
    captured = capsys.readouterr()
    assert code == 2 and not out.exists() and list(tmp_path.iterdir()) == []
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err
    assert "--input-shape" not in lines[0] and "'l1' skips 'l2', 'l3'" in lines[0]
    assert "wrote" not in captured.out


def test_a_residual_inside_one_exported_block_is_accepted():
    rows = import_model(f"{HERE}:resnet_blocks", (3, 8, 8))["layers"]
    assert [row["name"] for row in rows] == ["conv2d0", "basicblock1", "basicblock2", "adaptiveavgpool2d3",
                                              "flatten4", "linear5"]
    block = rows[1]
    assert block["input_elements_per_sample"] == block["output_elements_per_sample"] == 4 * 8 * 8
    assert block["num_params"] == 2 * (4 * 4 * 9 + 4)
    # the block's own add (4 x 8 x 8) and ReLUs are in its FLOPs, beside its two convolutions
    assert block["forward_flops_per_sample"] > 2 * 2 * (4 * 4 * 9) * 8 * 8


def test_a_residual_around_one_exported_layer_is_accepted():
    rows = import_model(f"{HERE}:residual_around_one", (WIDTH,))["layers"]
    assert [row["name"] for row in rows] == ["l1", "l2", "head"]
    # the add after l2 is counted in l2's row: l1's FLOPs plus one per element added
    assert rows[1]["forward_flops_per_sample"] == rows[0]["forward_flops_per_sample"] + WIDTH
    assert rows[1]["input_elements_per_sample"] == rows[1]["output_elements_per_sample"] == WIDTH


def test_reading_only_the_shape_of_an_earlier_tensor_is_accepted():
    rows = import_model(f"{HERE}:shape_of_the_input", (WIDTH,))["layers"]
    assert [row["name"] for row in rows] == ["l1", "l2"]
