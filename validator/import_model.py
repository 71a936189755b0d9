"""Bring your own model: turn a torch `nn.Module` factory into a simulator layer table.

    doc = import_model("torchvision.models:resnet18", (3, 224, 224))
    yaml.safe_dump(doc, open("resnet18.yaml", "w"), sort_keys=False)   # model: {file: resnet18.yaml}

The factory (`"package.module:factory"`, where `factory` may be a dotted attribute path and is
called as `factory(**kwargs)`) is built under `torch.device("meta")`, so no parameter memory is
allocated, and one sample (batch 1, a meta tensor of `input_shape`) is traced through it in
eval mode (BatchNorm uses its running statistics, dropout is off; the FLOPs are those of a
training forward all the same). The input is int64 token ids when the model's first module
with parameters is an `nn.Embedding`, float32 otherwise. If the module cannot be imported
from `sys.path`, the current directory is tried too.

**Granularity: one row per top-level child, in the order the forward calls them.**
* Wrappers are unwrapped: a model whose only child is a module (e.g. `self.net =
  nn.Sequential(...)`) is replaced by that child, repeatedly.
* `nn.ModuleList` / `nn.ModuleDict` children are expanded into their elements (`blocks.0`,
  `blocks.1`, ...), since only the elements are called.
* A model without children is one row.
* Children the forward never calls get no row (their parameters are not trained either).
* A child called several times is one row with the FLOPs of every call and the shapes of the
  first call.
* Ops the model runs between children (functional calls in its own `forward`, e.g.
  `torch.flatten`) are counted in the row of the child that ran last before them (the first
  row for ops before any child).
* Parameters owned by no child (e.g. a ViT's `cls_token` on the model itself) go to the first
  row, and a parameter shared by several children is counted once, in the first row that holds
  it (the simulator's convention for tied weights).
The simulator models a chain of layers: a stage boundary carries one row's outputs only. A model
whose top-level forward lets a tensor skip a row (a residual added across two or more rows, a
U-Net's encoder output fed to its decoder, the input or a mask handed to a later row) is refused
in one line naming the rows: `_ChainCheck` follows every tensor the forward makes outside the
rows (a `TorchFunctionMode`) from the call that produced it (the model's input: before the first
call) to each call, or op between calls, that reads it; a reader more than one call after the
producer is a skip. A skip inside one row (a ResNet basic block exported as one child), a residual
around one row (its add is counted in that row, whose input it is) and reading only a tensor's
shape or device stay accepted.

**Columns** (`simulator.workload.LAYER_TABLE_COLUMNS`), per sample:
* `forward_flops_per_sample`: GEMM/conv FLOPs as `torch.utils.flop_counter.FlopCounterMode`
  counts them (2 per multiply-add) plus the zoo's elementwise terms (BatchNorm/LayerNorm 5 per
  element, ReLU 1, GELU 8, tensor add 1, softmax 5, pooling; `validator/layers_flops.py`), so
  that imported tables and zoo models follow one convention. Other elementwise ops count 0.
* `backward_flops_per_sample`: 2x forward for a row whose child has parameters (also when
  they are counted in another row, as for a tied LM head: the weight gradient is still
  computed), 1x otherwise.
* `num_params`: as described above.
* `input_elements_per_sample` / `output_elements_per_sample`: the elements of all tensors
  going into / coming out of the child (forward hooks; at least 1).
* `saved_elements_per_sample`: approximated by the input elements.
* `kind`: `conv` if the child contains a convolution, else `attention` if it contains an
  `nn.MultiheadAttention` (or a module whose class name contains "Attention"), else `linear`
  (an `nn.Linear`, or an LSTM/GRU/RNN, whose FLOPs are then the recurrent closed form:
  `validator/import_model_kinds.py`), `embedding`, `norm` (BatchNorm, LayerNorm, GroupNorm, ...),
  `pool`, and `elementwise` for everything else (activations, flatten, dropout, identity).

The result is `{"name", "input_spec": {"shape", "source"}, "layers": [rows]}` made of plain
Python values, ready for `yaml.safe_dump`, and loads with
`simulator.model_source.load_layer_table`. `input_spec` carries no spec for the validator:
such a table can be simulated, not run for real. A model of more than `simulator.limits.MAX_LAYERS`
rows is refused (the simulator would not load its table). Every failure raises
`simulator.errors.ScenarioError` with a one-line message that names the target.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from simulator.errors import ScenarioError
from simulator.limits import MAX_INT, MAX_LAYERS, MAX_STRING_CHARS
from simulator.workload import LAYER_TABLE_COLUMNS
from validator.import_model_kinds import count_recurrent_in_closed_form, layer_kind
from validator.layers_flops import ForwardFlopCounter

_TARGET = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_BEFORE_ANY_LAYER = "before-any-layer"


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0].strip() if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _resolve_factory(target: str) -> Callable[..., Any]:
    if not isinstance(target, str) or not _TARGET.match(target.strip()):
        raise ScenarioError(f"import target {target!r}: expected 'package.module:factory'")
    module_name, attribute = target.strip().split(":")
    try:
        module = _import(module_name)
    except (Exception, SystemExit) as error:  # ImportError, anything the module raises, a sys.exit() on import
        raise ScenarioError(f"import target {target!r}: cannot import module {module_name!r}: "
                            f"{_one_line(error)}") from None
    factory: Any = module
    for part in attribute.split("."):
        if not hasattr(factory, part):
            raise ScenarioError(f"import target {target!r}: module {module_name!r} has no "
                                f"attribute {attribute!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ScenarioError(f"import target {target!r}: {attribute!r} is not callable "
                            f"(got {type(factory).__name__})")
    return factory


def _import(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        top = module_name.split(".")[0]
        cwd = os.getcwd()
        if error.name not in (top, module_name) or cwd in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, cwd)  # a console script does not have the current folder on sys.path
        try:
            return importlib.import_module(module_name)
        finally:
            sys.path.remove(cwd)


def _check_shape(target: str, input_shape) -> tuple[int, ...]:
    try:
        shape = tuple(input_shape)
        ok = len(shape) > 0 and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                    for d in shape)
    except TypeError:
        ok = False
    if not ok:
        raise ScenarioError(f"import target {target!r}: input_shape {input_shape!r} must be a "
                            f"non-empty tuple of positive ints (one sample, no batch dimension)")
    if math.prod(shape) > MAX_INT:  # torch's sizes are 64-bit: past this a tensor cannot even be described
        raise ScenarioError(f"import target {target!r}: input_shape {list(shape)} holds {math.prod(shape):.3g} "
                            f"elements per sample, more than {MAX_INT:.3g} (simulator.limits.MAX_INT)")
    return shape


def check_table_name(name: str | None, field: str = "name") -> None:
    """One-line ScenarioError naming `field` unless `name` is None or printable text of 1 to
    MAX_STRING_CHARS characters: the limit the written table is read back under (simulator.limits)."""
    if name is None:
        return
    if not name.strip() or len(name) > MAX_STRING_CHARS or not name.isprintable():
        shown = repr(name[:40]) + ("..." if len(name) > 40 else "")
        raise ScenarioError(f"{field}: {shown} ({len(name)} characters) must be printable text of 1 to "
                            f"{MAX_STRING_CHARS:,} characters on one line")


def _layer_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Top-level children in registration order after unwrapping single-child wrappers and
    expanding ModuleList / ModuleDict containers (module docstring)."""
    root, prefix = model, ""
    while True:
        children = list(root.named_children())
        if len(children) == 1 and not list(root.parameters(recurse=False)):
            name, root = children[0]
            prefix = f"{prefix}{name}."
            continue
        break

    def expand(name: str, module: nn.Module):
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            for child_name, child in module.named_children():
                yield from expand(f"{name}.{child_name}", child)
        else:
            yield name, module

    children = list(root.named_children())
    if not children:
        return [(prefix.rstrip(".") or type(root).__name__.lower(), root)]
    return [item for name, child in children for item in expand(f"{prefix}{name}", child)]


def _row_name(qualified: str, module: nn.Module) -> str:
    return f"{type(module).__name__.lower()}{qualified}" if qualified.isdigit() else qualified


def _elements(*values) -> int:
    return sum(leaf.numel() for leaf in tree_leaves(values) if isinstance(leaf, torch.Tensor))


def _sample_input(model: nn.Module, shape: tuple[int, ...]) -> torch.Tensor:
    first = next((m for m in model.modules()
                  if not list(m.children()) and list(m.parameters(recurse=False))), None)
    if isinstance(first, (nn.Embedding, nn.EmbeddingBag)):
        return torch.zeros((1, *shape), dtype=torch.long, device="meta")
    return torch.empty((1, *shape), dtype=torch.float32, device="meta")


class _ChainCheck(TorchFunctionMode):
    """Finds the first tensor that skips a row (module docstring). A tensor's origin is the top-level
    call that produced it (-1: the model's input); ops between calls run in the row of the last call
    (`position`) and their tensors take it as origin when they read a tracked tensor."""

    def __init__(self, names: list[str], stack: list[int]):
        super().__init__()
        self.names, self.stack = names, stack  # row names by layer index; the hooks' stack of calls
        self.calls: list[int] = []  # layer index of each top-level call
        self.position = -1
        self.origins: dict[int, tuple[int, torch.Tensor]] = {}  # id -> (origin, the tensor: keeps the id)
        self.skip: str | None = None

    def tag(self, values, origin: int) -> None:
        for leaf in tree_leaves(values):
            if isinstance(leaf, torch.Tensor):
                self.origins[id(leaf)] = (origin, leaf)

    def read(self, values, position: int, reader: str, through: int) -> bool:
        """Whether `values` hold a tracked tensor; records a skip where one's origin is more than one
        call before `position`; rows skipped: calls origin + 1 .. `through`."""
        tracked = False
        for leaf in tree_leaves(values):
            if isinstance(leaf, torch.Tensor) and id(leaf) in self.origins:
                tracked = True
                origin = self.origins[id(leaf)][0]
                if position - origin >= 2 and self.skip is None:
                    source = "the model's input" if origin < 0 else f"the output of {self.names[self.calls[origin]]!r}"
                    source = f"a tensor from {source}"
                    calls = range(origin + 1, through + 1)
                    skipped = [repr(n) for n in dict.fromkeys(self.names[self.calls[c]] for c in calls)]
                    if len(skipped) > 4:
                        skipped = [*skipped[:2], f"... {skipped[-1]} ({len(skipped)} layers)"]
                    self.skip = f"{source} skips {', '.join(skipped)} to reach {reader}"
        return tracked

    def called(self, index: int, args, kwargs) -> None:
        """A top-level call of layer `index` starts: it reads its arguments."""
        call = len(self.calls)
        self.calls.append(index)
        self.read((args, kwargs), call, repr(self.names[index]), call - 1)

    def returned(self, output) -> None:
        self.position = len(self.calls) - 1
        self.tag(output, self.position)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if not self.stack and any(isinstance(leaf, torch.Tensor) for leaf in tree_leaves(result)) \
                and not name.endswith("_like") and not name.startswith("new_"):  # shape and device only
            after = "the ops before the first layer" if self.position < 0 else \
                f"the ops after {self.names[self.calls[self.position]]!r}"
            if self.read((args, kwargs), self.position, after, self.position):
                self.tag(result, self.position)
        return result


def import_model(target: str, input_shape: tuple[int, ...], name: str | None = None,
                 kwargs: dict | None = None) -> dict:
    """Layer-table document `{"name", "input_spec", "layers"}` of the model `factory(**kwargs)`
    named by `target` ("package.module:factory"), traced with one sample of `input_shape`."""
    shape = _check_shape(target, input_shape)
    check_table_name(name)
    factory = _resolve_factory(target)
    try:
        with torch.device("meta"):
            model = factory(**(kwargs or {}))
    except (Exception, SystemExit) as error:  # the user's code: also a sys.exit() in it
        raise ScenarioError(f"import target {target!r}: the factory raised "
                            f"{_one_line(error)}") from None
    if not isinstance(model, nn.Module):
        raise ScenarioError(f"import target {target!r}: the factory returned "
                            f"{type(model).__name__}, not a torch.nn.Module")
    try:
        model = model.to("meta").eval()
    except (Exception, SystemExit) as error:  # the user's code: also a sys.exit() in it
        raise ScenarioError(f"import target {target!r}: cannot move the model to the meta "
                            f"device: {_one_line(error)}") from None

    layers = _layer_modules(model)
    counter = ForwardFlopCounter()
    counter.bucket = _BEFORE_ANY_LAYER
    order: list[int] = []
    shapes: dict[int, tuple[int, int]] = {}
    inputs: dict[int, int] = {}
    stack: list[int] = []
    chain = _ChainCheck([_row_name(qualified, module) for qualified, module in layers], stack)

    def pre_hook(index):
        def hook(module, args, kwargs):
            if not stack:
                chain.called(index, args, kwargs)
            stack.append(index)
            counter.bucket = index
            if index not in inputs:
                order.append(index)
                inputs[index] = _elements(args, kwargs)
        return hook

    def post_hook(index):
        def hook(module, args, kwargs, output):
            stack.pop()
            counter.bucket = stack[-1] if stack else index
            if not stack:
                chain.returned(output)
            if index not in shapes:
                shapes[index] = (inputs[index], _elements(output))
        return hook

    handles = []
    for index, (_, module) in enumerate(layers):
        handles.append(module.register_forward_pre_hook(pre_hook(index), with_kwargs=True))
        handles.append(module.register_forward_hook(post_hook(index), with_kwargs=True))
    handles += count_recurrent_in_closed_form(model, counter)  # after the rows' hooks
    sample = _sample_input(model, shape)
    try:
        chain.tag(sample, -1)
        with torch.no_grad(), counter, chain:
            model(sample)
    except (Exception, SystemExit) as error:  # the user's code: also a sys.exit() in it
        hint = " (traced on meta tensors, which hold no values: a forward reading them fails)" if "meta" in str(error) else ""
        raise ScenarioError(f"import target {target!r}: forward of one sample of input_shape "
                            f"{list(shape)} failed: {_one_line(error)}{hint}") from None
    finally:
        for handle in handles:
            handle.remove()
    if not order:
        raise ScenarioError(f"import target {target!r}: the forward called none of the model's "
                            f"layers")
    if len(order) > MAX_LAYERS:  # `ghpsim simulate` would refuse the table
        raise ScenarioError(f"import target {target!r}: {len(order):,} layers, more than the {MAX_LAYERS:,} a layer "
                            "table may have (simulator.limits.MAX_LAYERS); group them into larger modules")
    if chain.skip is not None:
        raise ScenarioError(f"import target {target!r}: not a chain of layers: {chain.skip}; make that span "
                            "one module, one layer (scenarios/README.md)")

    flops = {index: counter.gemm_by_bucket.get(index, 0) + counter.elementwise_by_bucket.get(index, 0)
             for index in order}
    flops[order[0]] += (counter.gemm_by_bucket.get(_BEFORE_ANY_LAYER, 0)
                        + counter.elementwise_by_bucket.get(_BEFORE_ANY_LAYER, 0))
    params = _params_per_layer(model, layers, order)

    rows = []
    for index in order:
        qualified, module = layers[index]
        forward = int(flops[index])
        input_elements, output_elements = shapes[index]
        trainable = any(True for _ in module.parameters())  # a tied copy still has a weight grad
        values = {
            "name": _row_name(qualified, module),
            "kind": layer_kind(module),
            "forward_flops_per_sample": forward,
            "backward_flops_per_sample": 2 * forward if trainable else forward,
            "num_params": int(params[index]),
            "input_elements_per_sample": max(1, int(input_elements)),
            "output_elements_per_sample": max(1, int(output_elements)),
            "saved_elements_per_sample": max(1, int(input_elements)),
        }
        rows.append({column: values[column] for column in LAYER_TABLE_COLUMNS})
    default_name = target.strip().split(":")[1].split(".")[-1]
    return {"name": name or default_name,
            "input_spec": {"shape": list(shape), "source": target.strip()},
            "layers": rows}


def _params_per_layer(model: nn.Module, layers, order: list[int]) -> dict[int, int]:
    seen: set[int] = set()
    params = {index: 0 for index in order}
    for index in order:
        for parameter in layers[index][1].parameters():
            if id(parameter) not in seen:
                seen.add(id(parameter))
                params[index] += parameter.numel()
    called = {id(p) for index in order for p in layers[index][1].parameters()}
    uncalled = {id(p) for index, (_, module) in enumerate(layers) if index not in params
                for p in module.parameters()} - called
    for parameter in model.parameters():  # owned by no layer: to the first row
        if id(parameter) not in seen and id(parameter) not in uncalled:
            seen.add(id(parameter))
            params[order[0]] += parameter.numel()
    return params


__all__ = ["import_model"]
