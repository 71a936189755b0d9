"""The one YAML loader for user input (scenarios, sweeps, layer tables, `--set` values), and its
JSON twin `load_json_text` (profiles, Hugging Face configs, report inputs).

yaml.SafeLoader (no code runs) with three changes: a key given twice in one mapping is an error
(not the last one silently winning); numbers and booleans are YAML 1.2's (8, -3, 1_000, 0.5, 1e9,
.inf; `0x10`, `010`, `1:20` stay text, so a field that needs a number refuses them; only true /
false are booleans, `yes`, `no`, `on`, `off` stay text, so a switch refuses them); and nesting deeper
than `MAX_DEPTH` is refused while parsing, before Python's recursion limit is reached.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import yaml

from simulator.errors import ScenarioError
from simulator.limits import MAX_DEPTH, MAX_FILE_BYTES, check_structure

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"
_BOOL = "tag:yaml.org,2002:bool"


class StrictLoader(yaml.SafeLoader):
    """SafeLoader refusing duplicate keys and deep nesting, with YAML 1.2 numbers."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base class refuses it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice",
                                                            key_node.start_mark)
        return super().construct_mapping(node, deep)


StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL]
    for first, resolvers in StrictLoader.yaml_implicit_resolvers.items()}
StrictLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
StrictLoader.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789"))
StrictLoader.add_implicit_resolver(_FLOAT, re.compile(
    r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF))$|^\.(?:nan|NaN|NAN)$"), list("-+0123456789."))


def load_yaml_text(text: str, origin: str):
    """Parse YAML text with `StrictLoader` and check its shape (`check_structure`); ScenarioError
    naming `origin` (and the line) for bad YAML, never quoting more than the parser's problem."""
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(error, "problem", None) or "not valid YAML"
        raise ScenarioError(f"{origin}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise ScenarioError(f"{origin}: malformed YAML: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError:  # int() of a number too long to convert
        raise ScenarioError(f"{origin}: malformed YAML: {_long_integer_place(text)}an integer of more than "
                            f"{sys.get_int_max_str_digits()} digits") from None
    check_structure(data, origin)
    return data


class _NonFinite(ValueError):
    """A NaN, Infinity or overflowing number met while parsing JSON (its text is the argument)."""


class _DuplicateKey(ValueError):
    """A JSON object key given twice (the key is the argument)."""


def _refused(value: float, allow_nan: bool) -> bool:
    """Whether a parsed JSON number is refused: an infinity, or a NaN unless `allow_nan`."""
    return math.isinf(value) or (math.isnan(value) and not allow_nan)


def load_json_text(text: str, origin: str, check: bool = True, *, malformed: str = "not valid JSON",
                   allow_nan: bool = False):
    """Parse JSON text refusing Infinity, numbers that overflow, NaN (unless `allow_nan`: ghpsim's
    own results write NaN for a figure not measured), nesting deeper than MAX_DEPTH and integers
    too long to convert; then `check_structure` unless `check` is False (for a document that may
    legitimately hold more than MAX_VALUES values, whose depth alone is then checked).
    ScenarioError: one line naming `origin` (and the field or the line), `malformed` leading the
    message of text that is not JSON."""
    def number(number_text: str) -> float:
        value = float(number_text)
        if _refused(value, allow_nan):
            raise _NonFinite(number_text)
        return value

    def unique(pairs: list) -> dict:  # as YAML, a key given twice is refused, not the last one taken
        data = dict(pairs)
        if len(data) < len(pairs):
            raise _DuplicateKey(next(key for index, (key, _) in enumerate(pairs) if key in dict(pairs[:index])))
        return data

    try:
        data = json.loads(text, parse_constant=number, parse_float=number, object_pairs_hook=unique)
    except _DuplicateKey as error:
        raise ScenarioError(f"{origin}: key {str(error)[:40]!r} is given twice") from None
    except _NonFinite as error:
        where = _non_finite_path(text, allow_nan)
        where = f"{where}: " if where else ""
        raise ScenarioError(f"{origin}: {where}{str(error)[:40]} is not a finite number") from None
    except json.JSONDecodeError as error:
        raise ScenarioError(f"{origin}: {malformed} (line {error.lineno}, column {error.colno}: "
                            f"{_json_problem(error.msg)})") from None
    except RecursionError:
        raise ScenarioError(f"{origin}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError:  # an integer of more than sys.get_int_max_str_digits() digits
        raise ScenarioError(f"{origin}: {_long_integer_place(text)}an integer of more than "
                            f"{sys.get_int_max_str_digits()} digits") from None
    if check:
        check_structure(data, origin)
    else:
        _check_depth(data, origin)
    return data


_JSON_PROBLEMS = {
    "Invalid control character at": "a control character (a raw tab, line break, ...) inside a string; "
                                    "write it as an escape such as \\n",
    "Unterminated string starting at": "a string starts here and never ends",
}
"""The json module's messages that end mid-sentence (it appends the position), in words."""


def _json_problem(message: str) -> str:
    """A `json.JSONDecodeError` message that reads on its own (the position is given beside it)."""
    return _JSON_PROBLEMS.get(message, message.removesuffix(" at"))


def _walk(data):
    """(dotted path, depth, value) of every value in loaded JSON, parents first, without recursion."""
    stack = [("", 0, data)]
    while stack:
        path, depth, value = stack.pop()
        yield path, depth, value
        if isinstance(value, (dict, list)) and depth <= MAX_DEPTH:
            items = value.items() if isinstance(value, dict) else enumerate(value)
            children = [(f"{path}.{key}" if path else str(key), depth + 1, item) for key, item in items]
            stack.extend(reversed(children))


def _check_depth(data, origin: str) -> None:
    """ScenarioError naming the path where `data` nests more than MAX_DEPTH deep."""
    for path, depth, _value in _walk(data):
        if depth > MAX_DEPTH:
            raise ScenarioError(f"{origin}: {path}: nested more than {MAX_DEPTH} levels deep")


def _non_finite_path(text: str, allow_nan: bool) -> str:
    """The dotted path of the first refused number (`_refused`) in JSON `text` ('' when not found)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return ""
    return next((path or "top level" for path, _depth, value in _walk(data)
                 if isinstance(value, float) and _refused(value, allow_nan)), "")


def _long_integer_place(text: str) -> str:
    """'line L, column C: ' of the first run of digits too long to convert in `text` ('' if none)."""
    found = re.search(r"\d{%d,}" % (sys.get_int_max_str_digits() + 1), text)
    if found is None:
        return ""
    line = text.count("\n", 0, found.start()) + 1
    column = found.start() - text.rfind("\n", 0, found.start())
    return f"line {line}, column {column}: "


def read_text_file(path: str | Path, what: str) -> str:
    """A UTF-8 file's text; ScenarioError (naming `what`, e.g. "model.file: 'x.csv'") when it is
    missing, larger than MAX_FILE_BYTES or not UTF-8."""
    path = Path(path)
    if not path.is_file():
        problem = ("is a directory, not a file" if path.is_dir() else
                   "is not a regular file" if path.exists() else "file not found")
        raise ScenarioError(f"{what}: {problem}")
    size_bytes = path.stat().st_size
    if size_bytes > MAX_FILE_BYTES:
        raise ScenarioError(f"{what}: {size_bytes} bytes, larger than the {MAX_FILE_BYTES} bytes ghpsim reads")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{what}: not a UTF-8 text file") from None
    except OSError as error:  # e.g. a device or /proc file that refuses to be read
        raise ScenarioError(f"{what}: cannot be read ({error.strerror or error})") from None


def read_yaml_file(path: str | Path, what: str | None = None):
    """`load_yaml_text` of a file (size-checked), errors naming `what` (default: the path)."""
    what = what or str(path)
    text = read_text_file(path, what)
    data = load_yaml_text(text, what)
    if data is None:  # not "got NoneType" from the caller's type check
        blank = all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines())
        raise ScenarioError(f"{what}: " + ("the file is empty" if blank else "the file holds only null (no content)"))
    return data
