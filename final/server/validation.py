"""A request body checked against its model (protocol.py), and pydantic's errors turned into the
one 400 a client reads: the first offending field by its JSON path (`messages[0].content`), the
unsupported field by name, a union field by what it may be rather than by each failed branch."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .errors import bad_request
from .protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS
from .strict_model import StrictModel

# What a union field may be, for its error message: pydantic reports one error per branch.
UNION_FIELDS = {
    "prompt": "a non-empty string, a list of them, a list of token ids, or a list of lists of token ids",
    "stop": f"a string or a list of at most {MAX_STOP_STRINGS} strings, each of 1 to {MAX_STOP_CHARS} "
    "characters",
    "content": "a string or a non-empty list of text parts",
    "tool_choice": '"none", "auto", "required", or {"type": "function", "function": {"name": ...}}',
}


TYPE_LABELS = {"str", "int", "float", "bool"}


def parse(model: type[StrictModel], body: Any) -> Any:
    """Validate a decoded JSON body; a 400 naming the first offending field otherwise."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}
    try:
        return model.model_validate(body)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = tuple(first.get("loc", ()))
        param = _param_name(loc)
        if first.get("type") == "extra_forbidden":
            raise bad_request(
                f"unsupported field {param!r}: this server does not implement it", param=param
            ) from None
        union = next((name for name in UNION_FIELDS if name in loc and name != loc[-1]), None)
        if union is not None:
            # One error per branch of the union: a range error in the branch whose type matched
            # says more than "must be a string or ...".
            same = [e for e in err.errors(include_url=False) if union in e.get("loc", ())]
            ranged = [e for e in same if not str(e.get("type", "")).endswith("_type")]
            if ranged:
                first, loc = ranged[0], tuple(ranged[0]["loc"])
                param = _param_name(loc)
            else:
                at = _param_name(loc[: loc.index(union) + 1])
                raise bad_request(f"{at}: must be {UNION_FIELDS[union]}", param=at) from None
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        if "content" in loc and loc[-1] == "type":
            message = f"only text content parts are supported (type 'text'), got {first.get('input')!r}"
        raise bad_request(f"{param}: {message}" if param else message, param=param or None) from None


def _param_name(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not isinstance(part, str) or not part.isidentifier() or part in TYPE_LABELS:
            continue  # pydantic's union-branch labels (`str`, `list[int]`, ...), not fields
        else:
            out += f".{part}" if out else part
    return out
