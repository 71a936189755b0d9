"""One line for a pydantic ValidationError: the file, the dotted field path as the user wrote it,
the offending value (shortened) and the reason. Used by the scenario and sweep schemas.

A union field (`strategy.partition`: a name or a list of sizes) fails in every branch; the line
reports the branch the input was meant for, not a branch whose type it is not (`*_type`,
`literal_error`), and leaves pydantic's branch names out of the path.
"""

from __future__ import annotations

import re
import reprlib

from pydantic import ValidationError


def format_validation_error(error: ValidationError, origin: str) -> str:
    """One line: file, dotted field path, offending value, reason (first error only)."""
    first = next((e for e in error.errors() if not e["type"].endswith("_type") and e["type"] != "literal_error"),
                 error.errors()[0])  # of a union's branch errors, one from the branch the input is (module doc)
    if first["type"] == "missing":  # a misspelt key beside it explains it: name both (`modle` for `model`)
        unknown_key = next((e for e in error.errors() if e["type"] == "extra_forbidden"
                            and e["loc"][:-1] == first["loc"][:-1]), None)
        if unknown_key is not None:
            return (f"{origin}: {'.'.join(map(str, unknown_key['loc']))}: unknown key "
                    f"({'.'.join(map(str, first['loc']))}: missing required field)")
    loc = first["loc"]
    if first["type"] == "extra_forbidden":  # the last part is the user's unknown key, whatever it looks like
        loc, unknown = loc[:-1], loc[-1:]
    else:
        unknown = ()
    field = ".".join(str(part) for part in (*(p for p in loc if not _is_branch_tag(p)), *unknown))
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return f"{origin}: {field}: unknown key"
    if first["type"] == "missing":
        return f"{origin}: {field}: missing required field"
    if message.startswith(("strategy.", "cluster.", "costs.")) or not field:
        return f"{origin}: {message}"
    return f"{origin}: {field}: {message} (got {_SHORT_REPR.repr(first.get('input'))})"


_BRANCH_TAG = re.compile(r"[a-z][a-z0-9_-]*\[.*\]|\[key\]|int|float|str|bool|none", re.DOTALL)


def _is_branch_tag(part) -> bool:
    """pydantic's name of a union branch or validator in an error's location (`literal['a','b']`,
    `list[int]`, `function-after[...]`, `int`, `[key]`): not a key the user wrote."""
    return isinstance(part, str) and _BRANCH_TAG.fullmatch(part) is not None


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxdict, _SHORT_REPR.maxlist, _SHORT_REPR.maxtuple = 2, 4, 6, 6
_SHORT_REPR.maxstring, _SHORT_REPR.maxother, _SHORT_REPR.maxlong = 80, 80, 40
"""Quotes an offending value in a few dozen characters, however large (an expanded YAML alias)."""


def short_repr(value) -> str:
    """`value` quoted in a few dozen characters (`_SHORT_REPR`), for a one-line error or note."""
    return _SHORT_REPR.repr(value)
