"""Turn a scenario's `model` section into a Workload: a zoo name, an inline table, a table file or a
Hugging Face config.json (`load_hf_config`: LLaMA-style decoders and mixtures of experts).

A layer-table file is YAML (a list of rows, or a mapping with `name`, `layers` and optional
`input_spec`) or CSV with the columns of `simulator.workload.LAYER_TABLE_COLUMNS`. Missing
`backward_flops_per_sample` defaults to 2x forward for layers with parameters and 1x otherwise;
missing `saved_elements_per_sample` defaults to the layer's input elements. A relative file is
read from the scenario's folder; errors name the file, row and column, never the file's contents.
At most `simulator.limits.MAX_LAYERS` layers.
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

from pydantic import ValidationError

from simulator.errors import ScenarioError, nearest_names
from simulator.layer_csv import read_layer_csv
from simulator.limits import check_model_params, check_num_layers, check_num_params, check_structure
from simulator.scenario import LayerRow, ModelConfig
from simulator.workload import Layer, Workload
from simulator.yaml_loading import load_json_text, read_text_file, read_yaml_file
from simulator.zoo import MODELS, build_model
from simulator.zoo._ops import DimensionError
from simulator.zoo.llama import llama, llama_workload
from simulator.zoo.moe import moe, moe_workload


def resolve_workload(model: ModelConfig, base_dir: str = ".") -> Workload:
    if model.name is not None:
        return _from_zoo(model.name, model.params)
    if model.layers is not None:
        return workload_from_rows("inline", model.layers, source="model.layers")
    if model.hf_config is not None:
        return load_hf_config(Path(base_dir) / model.hf_config, model.params)
    return load_layer_table(Path(base_dir) / model.file)


def _from_zoo(name: str, params: dict) -> Workload:
    key = name.lower()
    if key not in MODELS:
        near = nearest_names(key, MODELS, cutoff=0.5)
        hint = f"nearest: {', '.join(near)}" if near else f"known: {', '.join(sorted(MODELS))}"
        raise ScenarioError(f"model.name: unknown model {name!r}; {hint}")
    params = checked_params(name, MODELS[key], params)
    check_model_params(params)
    try:
        workload = build_model(key, **params)
    except TypeError as error:
        texts = [key for key, value in params.items() if isinstance(value, str)]
        if texts and "keyword argument" not in str(error):  # a name where the model computes with a number
            raise ScenarioError(f"model.params.{texts[0]}: {params[texts[0]]!r} not accepted by model {name!r} "
                                "(expected a number)") from None
        raise ScenarioError(f"model.params: {params!r} not accepted by model {name!r}: {error}") from None
    except DimensionError as error:
        raise ScenarioError(error.names_as(lambda key: f"model.params.{key}")) from None
    except (ValueError, ZeroDivisionError, OverflowError) as error:
        raise ScenarioError(f"model.params: {params!r}: {error}") from None
    check_num_layers(workload.num_layers, "model.params")
    for layer in workload.layers:
        counts = (layer.num_params, layer.input_elements_per_sample, layer.output_elements_per_sample)
        if min(counts) < 0 or layer.output_elements_per_sample == 0:
            raise ScenarioError(f"model.params: {params!r} gives layer {layer.name!r} non-positive sizes")
    check_num_params(workload.num_params, _largest_size(("model.params.", params)) or f"model.name: {name!r}")
    return workload


def _largest_size(*fields: tuple[str, dict]) -> str:
    """"prefix+key=value" of the largest number among (prefix, values) pairs, the field that most
    likely made a model too large; "" when there is no number."""
    numbers = [(value, f"{prefix}{key}={value!r}") for prefix, values in fields for key, value in values.items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)]
    return max(numbers)[1] if numbers else ""


def checked_params(name: str, factory, params: dict, label: str | None = None) -> dict:
    """`params` as the zoo factory `factory` of model `name` takes them (`label`: how an error
    calls the model): a ScenarioError naming `model.params.<key>` for a key that is not one of the
    factory's keywords, a value not of the kind of its default (a number where it takes a number:
    a YAML `true` is not a count; a name where a name), or a fraction where its annotation is int;
    a whole float there (`1e3`) becomes an int, as an integer scenario field takes it."""
    signature = inspect.signature(factory, eval_str=True)
    keywords = {key: parameter for key, parameter in signature.parameters.items()
                if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)}
    label = label or name
    for key in params:
        if key not in keywords:
            raise ScenarioError(f"model.params.{key}: not a parameter of {label} (its parameters: "
                                f"{', '.join(keywords)})")
    checked = {}
    for key, value in params.items():
        parameter = keywords[key]
        if parameter.default is not inspect.Parameter.empty:
            _check_kind(key, value, parameter.default, label)
        if isinstance(value, float) and _whole_number_annotation(parameter.annotation):
            if not value.is_integer():
                raise ScenarioError(f"model.params.{key}: {value!r} is not a whole number")
            if abs(value) > MAX_EXACT_FLOAT_INT:
                raise ScenarioError(f"model.params.{key}: {value!r} is too large for a model dimension")
            value = int(value)
        checked[key] = value
    return checked


MAX_EXACT_FLOAT_INT = 2**53
"""The largest float whose neighbours are whole numbers one apart: a larger "whole" float is a
rounded one, and sizes that large exceed every model limit anyway (`simulator.limits`)."""


def _whole_number_annotation(annotation) -> bool:
    """True for `int` and `int | None`, not for `float`, `bool` or a union with float."""
    kinds = typing.get_args(annotation) or (annotation,)
    return int in kinds and float not in kinds


def _check_kind(key: str, value, default, label: str) -> None:
    """ScenarioError when `value` is not of the kind of the factory's `default` (`checked_params`)."""
    def is_number(item) -> bool:
        return isinstance(item, (int, float)) and not isinstance(item, bool)

    if is_number(default) and not is_number(value):
        expected = "a number"
    elif isinstance(default, str) and not isinstance(value, str):
        expected = "a name"
    elif isinstance(value, bool) and not isinstance(default, bool):
        expected = "a number or a name"
    else:
        return
    raise ScenarioError(f"model.params.{key}: expected {expected} for model {label!r}, got {value!r}")


HF_DIMENSIONS = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size",
                 "num_attention_heads": "num_heads", "intermediate_size": "ffn_hidden_size",
                 "vocab_size": "vocab_size"}
"""Required config.json keys (transformers `LlamaConfig`) -> `simulator.zoo.llama.llama` parameters."""
HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "deepseek")
"""config.json `model_type`s read: LLaMA-style decoders (RMSNorm, rotary, SwiGLU) and the Mixtral and
DeepSeekMoE mixtures; another type is refused by name. A config without `model_type` is read as LLaMA-style."""
HF_QKV_BIAS_TYPES = ("qwen2",)
"""Types whose Q, K and V projections carry biases with no `attention_bias` key (Qwen2's `Qwen2Attention`)."""
HF_UNSUPPORTED = ("num_experts", "kv_lora_rank", "q_lora_rank", "attention_bias", "mlp_bias")
"""Keys of variants not modelled yet (Qwen-style MoE, DeepSeek-V2's latent attention (MLA), biased
linears): refused when set."""
HF_MOE_KEYS = {"num_experts_per_tok": "top_k", "n_shared_experts": "num_shared_experts",
               "first_k_dense_replace": "num_dense_layers"}
"""Mixture-of-experts keys -> `simulator.zoo.moe.moe_workload` keywords: Mixtral (`MixtralConfig`:
num_local_experts, num_experts_per_tok, intermediate_size = each expert's width) and DeepSeekMoE
(`DeepseekConfig`: n_routed_experts, n_shared_experts, moe_intermediate_size, first_k_dense_replace,
intermediate_size = the dense layers' width)."""


def load_hf_config(path: Path, params: dict) -> Workload:
    """A LLaMA-style decoder from a Hugging Face config.json (hidden_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings,
    tie_word_embeddings; hidden_act must be silu and rms_norm_eps present), or a mixture of experts
    (Mixtral, DeepSeekMoE: `HF_MOE_KEYS`, built by `simulator.zoo.moe`). seq_len defaults to
    max_position_embeddings, or to rope_scaling's original_max_position_embeddings where the context
    was extended after pre-training (LLaMA-3.1); `params` (the `llama` or `moe` factory's keywords)
    override. Errors name the key and its value (`_shown`: short), never quote more of the file."""
    what = f"model.hf_config: {str(path)!r}"
    if path.suffix.lower() != ".json":
        raise ScenarioError(f"{what}: expected a .json file (a Hugging Face config.json)")
    config = load_json_text(read_text_file(path, what), what)
    if not isinstance(config, dict):
        raise ScenarioError(f"{what}: expected a JSON object")

    def positive(key: str, default=None) -> int:
        value = config.get(key)
        if value is None and default is not None:  # absent or null: transformers' default
            value = default
        if value is None:
            raise ScenarioError(f"{what}: {key}: expected a positive integer, got null" if key in config
                                else f"{what}: missing key {key}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScenarioError(f"{what}: {key}: expected a positive integer, got {_shown(value)}")
        return value

    model_type = config.get("model_type")
    if model_type is not None and model_type not in HF_MODEL_TYPES:  # e.g. GPT-2, Gemma, Mamba, RecurrentGemma
        raise ScenarioError(f"{what}: model_type: {_shown(model_type)} is not supported (supported: "
                            f"{', '.join(HF_MODEL_TYPES)}: LLaMA-style decoders, Mixtral and DeepSeekMoE)")
    for key in HF_UNSUPPORTED:
        if config.get(key):
            raise ScenarioError(f"{what}: {key}: {_shown(config[key])}: not supported yet (LLaMA-style, Mixtral and "
                                "DeepSeekMoE models only)")
    activation_key = "hidden_act" if "hidden_act" in config else "hidden_activation"  # Gemma's name for it
    if config.get(activation_key, "silu") != "silu":
        raise ScenarioError(f"{what}: {activation_key}: {_shown(config[activation_key])}: only silu (a SwiGLU MLP) "
                            "is supported")
    if "rms_norm_eps" not in config:
        raise ScenarioError(f"{what}: missing key rms_norm_eps (only RMSNorm models are supported)")
    tie = config.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ScenarioError(f"{what}: tie_word_embeddings: expected true or false")
    built = {ours: positive(key) for key, ours in HF_DIMENSIONS.items()}
    own_head_dim = config.get("head_dim")  # Qwen3, Mistral-NeMo: heads wider or narrower than hidden / heads
    if own_head_dim is not None and positive("head_dim") * built["num_heads"] != built["hidden_size"]:
        raise ScenarioError(f"{what}: head_dim: {own_head_dim} x num_attention_heads {built['num_heads']} is not "
                            f"hidden_size {built['hidden_size']}; attention is modelled with head_dim = hidden_size / "
                            "num_attention_heads only")
    built["num_kv_heads"] = positive("num_key_value_heads", built["num_heads"])
    built["seq_len"] = built["max_positions"] = positive("max_position_embeddings", 2048)
    pretrained = _pretraining_context(config, built["max_positions"], what)
    if pretrained is not None:
        built["seq_len"] = pretrained
    built["tie_embeddings"] = tie
    experts = _hf_experts(config, built, positive, what)
    if model_type in HF_QKV_BIAS_TYPES:
        if experts:
            raise ScenarioError(f"{what}: model_type: {_shown(model_type)} with experts: a mixture of experts with "
                                "Q, K and V biases is not supported yet")
        built["qkv_bias"] = True
    factory, build = (moe, moe_workload) if experts else (llama, llama_workload)
    built.update(experts)
    windowed = config.get("use_sliding_window", True)
    if not isinstance(windowed, bool):
        raise ScenarioError(f"{what}: use_sliding_window: expected true or false, got {_shown(windowed)}")
    if config.get("sliding_window") and windowed \
            and "sliding_window" in inspect.signature(factory).parameters:  # Mistral-style window
        built["sliding_window"] = positive("sliding_window")
    params = checked_params("hf_config", factory, params, "an hf_config model")
    check_model_params(params)
    merged = {**built, **params}
    check_num_layers(int(merged["num_layers"]) + 2, what)
    try:
        workload = build(path.stem, **merged)
    except DimensionError as error:  # worded with the file's keys, or the model.params that replaced them
        def named(ours: str) -> str:
            return f"model.params.{ours}" if ours in params else hf_key(ours, config)
        raise ScenarioError(f"{what}: {error.names_as(named)}") from None
    except ValueError as error:
        raise ScenarioError(f"{what}: {error}") from None
    check_num_layers(workload.num_layers, what)
    sizes = {key: config[key] for key in (*HF_DIMENSIONS, "num_local_experts", "n_routed_experts",
                                          "moe_intermediate_size") if key in config}
    check_num_params(workload.num_params, _largest_size(("model.params.", params), (f"{what}: ", sizes)))
    return workload


def _original_context_key(config: dict) -> str | None:
    """Where the file gives the context before a RoPE extension: rope_scaling's
    original_max_position_embeddings (LLaMA-3.1), the top-level key (Phi-3's LongRoPE), or None."""
    rope = config.get("rope_scaling")
    if isinstance(rope, dict) and rope.get("original_max_position_embeddings") is not None:
        return "rope_scaling.original_max_position_embeddings"
    return "original_max_position_embeddings" if config.get("original_max_position_embeddings") is not None else None


def _original_context(config: dict):
    """The pre-extension context as the file gives it (`_original_context_key`), or None."""
    key = _original_context_key(config)
    if key is None:
        return None
    return config["rope_scaling"][ORIGINAL] if key.startswith("rope_scaling.") else config[ORIGINAL]


ORIGINAL = "original_max_position_embeddings"


def _shown(value) -> str:
    """A config value for an error line: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _pretraining_context(config: dict, max_positions: int, what: str) -> int | None:
    """rope_scaling's original_max_position_embeddings (the context before a RoPE extension such as
    LLaMA-3.1's, from 8,192 to 131,072 tokens: the length pre-training ran at), or None."""
    rope = config.get("rope_scaling")
    if rope is not None and not isinstance(rope, dict):
        raise ScenarioError(f"{what}: rope_scaling: expected an object or null, got {_shown(rope)}")
    original = _original_context(config)
    if original is None:
        return None
    if not isinstance(original, int) or isinstance(original, bool) or not 1 <= original <= max_positions:
        raise ScenarioError(f"{what}: {_original_context_key(config)}: expected a positive integer "
                            f"up to max_position_embeddings ({max_positions}), got {_shown(original)}")
    return original


def hf_key(ours: str, config: dict) -> str:
    """The config.json key a `llama` / `moe` keyword is read from (`HF_DIMENSIONS`, `HF_MOE_KEYS`,
    `load_hf_config`, `_hf_experts`)."""
    deepseek = config.get("n_routed_experts") is not None
    keys = {**{ours: key for key, ours in (*HF_DIMENSIONS.items(), *HF_MOE_KEYS.items())},
            "num_kv_heads": "num_key_value_heads" if "num_key_value_heads" in config else "num_attention_heads",
            "seq_len": _original_context_key(config) or "max_position_embeddings",
            "max_positions": "max_position_embeddings",
            "num_experts": "n_routed_experts" if deepseek else "num_local_experts",
            "expert_ffn_hidden_size": "moe_intermediate_size" if deepseek else "intermediate_size",
            "dense_ffn_hidden_size": "intermediate_size", "tie_embeddings": "tie_word_embeddings"}
    return keys.get(ours, ours)


def _hf_experts(config: dict, built: dict, positive, what: str) -> dict:
    """`moe_workload` keywords of a mixture-of-experts config.json (`HF_MOE_KEYS`), {} for a dense
    model; moves intermediate_size to the experts' width (Mixtral) or the dense layers' (DeepSeek)."""
    deepseek = config.get("n_routed_experts") is not None
    if not deepseek:  # these change a model's size, and only DeepSeekMoE's layers read them
        for key in DEEPSEEK_ONLY_KEYS:
            if config.get(key):
                raise ScenarioError(f"{what}: {key}: {_shown(config[key])} is read only with n_routed_experts "
                                    "(DeepSeekMoE); this config has none")
    if config.get("num_local_experts") is None and not deepseek:
        return {}  # a dense model (a present key, 0 included, is checked below: `positive`)
    if deepseek and config.get("moe_layer_freq", 1) != 1:
        raise ScenarioError(f"{what}: moe_layer_freq: only 1 (every layer after the dense ones) is supported")
    key = "n_routed_experts" if deepseek else "num_local_experts"
    if "num_experts_per_tok" not in config:
        raise ScenarioError(f"{what}: missing key num_experts_per_tok (needed with {key}: a mixture of experts)")
    dense_ffn = built.pop("ffn_hidden_size")
    experts = {"num_experts": positive(key),
               "top_k": positive("num_experts_per_tok")}
    if deepseek:
        experts["expert_ffn_hidden_size"] = positive("moe_intermediate_size")
        for key in ("n_shared_experts", "first_k_dense_replace"):
            value = config.get(key) or 0
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ScenarioError(f"{what}: {key}: expected a non-negative integer")
            experts[HF_MOE_KEYS[key]] = value
        experts["dense_ffn_hidden_size"] = dense_ffn
    else:
        experts["expert_ffn_hidden_size"] = dense_ffn
    return experts


DEEPSEEK_ONLY_KEYS = ("n_shared_experts", "moe_intermediate_size", "first_k_dense_replace")
"""DeepSeekMoE's keys (`DeepseekConfig`), refused in any other config: none is read there."""


def load_layer_table(path: Path) -> Workload:
    """Read a layer table file (YAML or CSV)."""
    what = f"model.file: {str(path)!r}"
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".yaml", ".yml"):
        raise ScenarioError(f"{what}: expected a .yaml, .yml or .csv layer table")
    if suffix == ".csv":
        rows, name, input_spec = read_layer_csv(read_text_file(path, what), what), path.stem, {}
    else:
        data = read_yaml_file(path, what)
        if isinstance(data, list):
            data = {"layers": data}
        if not isinstance(data, dict):
            raise ScenarioError(f"{what}: expected a list of layer rows or a mapping with layers")
        if set(data) - {"name", "layers", "input_spec"}:  # the key is the file's text: not quoted
            raise ScenarioError(f"{what}: a top-level key that is not a layer-table key (expected name, layers "
                                "and input_spec)")
        rows, name, input_spec = data.get("layers"), data.get("name", path.stem), data.get("input_spec", {})
        if not isinstance(rows, list) or not isinstance(name, str) or not isinstance(input_spec, dict):
            raise ScenarioError(f"{what}: expected layers (a list of rows), name (text) and input_spec (a mapping)")
    check_structure(rows, what)
    check_num_layers(len(rows), what)
    validated = tuple(_layer_row(row, index, what) for index, row in enumerate(rows))
    return workload_from_rows(name, validated, input_spec, source=what)


def _layer_row(row, index: int, what: str) -> LayerRow:
    """Row `index` of a table file; an error names the row and column, and quotes a number but
    never the file's text (a column's name, a text value)."""
    try:
        return LayerRow.model_validate(row)
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "extra_forbidden":
            keys = list(row.keys()) if hasattr(row, "keys") else []
            column = f"column {keys.index(first['loc'][0]) + 1}" if first["loc"] and first["loc"][0] in keys else "a column"
            raise ScenarioError(f"{what}: layers row {index}: {column} is not a layer-table column "
                                f"(expected {', '.join(LayerRow.model_fields)})") from None
        where = "".join(f"{part}: " for part in first["loc"])
        value = first.get("input")
        got = f" (got {value})" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        raise ScenarioError(f"{what}: layers row {index}: {where}{first['msg']}{got}") from None


def workload_from_rows(name: str, rows: tuple[LayerRow, ...], input_spec: dict | None = None,
                       source: str = "model.layers") -> Workload:
    """The workload of validated layer rows; `source` (the table's field or file) names a fault."""
    if not rows:
        raise ScenarioError(f"{source}: the layer table is empty")
    check_num_layers(len(rows), source)
    layers = []
    for row in rows:
        backward = row.backward_flops_per_sample
        if backward is None:
            backward = row.forward_flops_per_sample * (2 if row.num_params else 1)
        saved = row.saved_elements_per_sample
        layers.append(Layer(
            name=row.name, kind=row.kind, forward_flops_per_sample=row.forward_flops_per_sample,
            backward_flops_per_sample=backward, num_params=row.num_params,
            input_elements_per_sample=row.input_elements_per_sample,
            output_elements_per_sample=row.output_elements_per_sample,
            saved_elements_per_sample=row.input_elements_per_sample if saved is None else saved))
    largest = max(range(len(layers)), key=lambda index: layers[index].num_params)
    check_num_params(sum(layer.num_params for layer in layers),
                     f"{source}: layers row {largest}: num_params={layers[largest].num_params}")
    return Workload(name, tuple(layers), input_spec or {})
