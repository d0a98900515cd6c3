"""Small checks shared by every pydantic description of a trial (stack config, stack outputs,
cluster, requests): one wording for a validation failure, one rule for rank numbering, and the lines a
user's own file is refused with (`problems`)."""

from __future__ import annotations

import datetime as dt
import difflib
import json
import types
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel


def explain(error: Any, whole: str = "input") -> str:
    """A pydantic ValidationError as one line: 'field.path: message; …' (`whole` names the root)."""
    return "; ".join(f"{'.'.join(map(str, x['loc'])) or whole}: {x['msg']}" for x in error.errors())


def require_ranks(ranks: Iterable[int]) -> None:
    """Hosts are ranks 0..N−1, each exactly once (raises ValueError, inside a pydantic validator)."""
    got = sorted(ranks)
    if got != list(range(len(got))):
        raise ValueError(f"host ranks must be 0..{len(got) - 1} once each, got {got}")


# what a value of each pydantic type error should have been, in a config file's words
_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "string_type": "a string",
    "bool_type": "true or false", "bool_parsing": "true or false", "list_type": "a list [...]",
    "tuple_type": "a list [...]", "dict_type": "a table of keys", "model_type": "a table of keys",
    "model_attributes_type": "a table of keys", "datetime_type": "a date and time (ISO 8601)",
    "datetime_parsing": "a date and time (ISO 8601, e.g. 2026-12-06T18:00:00Z)",
    "datetime_from_date_parsing": "a date and time (ISO 8601, e.g. 2026-12-06T18:00:00Z)",
}
_PREFIXES = ("Value error, ", "Assertion failed, ")


def problems(errors: Iterable[Mapping[str, Any]], model: type[BaseModel], data: Any, root: str = "") -> list[str]:
    """One line per validation error of a file the user wrote (`errors`: a ValidationError's
    `.errors()`, for `model` validating `data`): `KEY: what is wrong` with its fix, KEY as the file
    writes it (`profiles.smoke.dev`; a list item by its `name` where it has one: `arms.ddp-pair.world_size`).
    An unknown key is given the keys allowed there (the closest one as a guess); a missing one, that
    it is required and what it takes; a wrong value, what it should be. Pydantic's own text spreads an
    error over three lines in its own terms ("Extra inputs are not permitted", a URL) and names no fix.
    A model may declare `written_keys`, keys its file holds that are read before validation (a
    profile's `base`), so that they are listed as allowed too. `root`: where `data` sits in its file
    (`trials:cluster` in a stack config), put before every key."""
    errors = list(errors)
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    misspelt: set[tuple[Any, ...]] = set()  # missing keys an unknown key's guess names: said on its line
    out: list[tuple[tuple[Any, ...], str]] = []
    for err in errors:
        parts, parent, at = _walk(err["loc"], model, data)
        parts = [root, *parts] if root else parts
        key = _joined(parts)
        kind, msg = err["type"], str(err["msg"])
        shown = _shown(err.get("input"))
        if kind == "extra_forbidden":
            name = str(err["loc"][-1])
            allowed = _allowed(parent)
            guess = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
            where = _joined(parts[:-1])
            required = bool(guess) and (loc := (*err["loc"][:-1], guess[0])) in missing
            if required:
                misspelt.add(loc)
            line = (f"{key}: unknown key" + (f" (did you mean {guess[0]}?" + (
                f" {guess[0]} is required, and missing)" if required else ")") if guess else "")
                    + f"; the keys allowed {'in ' + where if where else 'at the top level'}: {', '.join(allowed)}")
        elif kind == "missing":
            line = f"{key}: required, and missing: add it ({_words(at)})"
        elif kind in _EXPECTED or kind in ("literal_error", "enum"):
            expected = _EXPECTED.get(kind) or f"one of {err.get('ctx', {}).get('expected', '')}"
            line = f"{key} = {shown}: expected {expected}"
        elif kind in ("too_long", "too_short"):
            ctx = err.get("ctx", {})
            line = f"{key} = {shown}: {ctx.get('actual_length')} item(s), " + (
                f"more than the {ctx.get('max_length')} allowed" if kind == "too_long"
                else f"fewer than the {ctx.get('min_length')} required")
        else:
            for p in _PREFIXES:
                msg = msg.removeprefix(p)
            line = (f"{key}: {msg}" if kind in ("value_error", "assertion_error") else f"{key} = {shown}: {msg}"
                    ) if key else msg
        if all(line != seen for _, seen in out):  # one value refused by several members of a union: said once
            out.append((tuple(err["loc"]), line))
    return [line for loc, line in out if loc not in misspelt]


def _walk(loc: Iterable[Any], model: Any, data: Any) -> tuple[list[str], Any, Any]:
    """(KEY's parts as written, the type holding the last part, the type at KEY) for a pydantic `loc`."""
    parts: list[str] = []
    held, ann = None, model
    for part in loc:
        ann = _bare(ann)
        origin = get_origin(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(part, str):
            held, field = ann, ann.model_fields.get(part)
            ann = field.annotation if field is not None else None
        elif origin in (list, tuple) and isinstance(part, int):
            held, args = ann, [a for a in get_args(ann) if a is not Ellipsis]
            ann = args[min(part, len(args) - 1)] if args else None
        elif origin is dict:
            held, ann = ann, (get_args(ann) or (None, None))[-1]
        elif origin in (Union, types.UnionType) and isinstance(part, str) and not (isinstance(data, dict)
                                                                                and part in data):
            continue  # a union member's tag pydantic adds: no key of the file
        if isinstance(part, int) and isinstance(data, list) and 0 <= part < len(data):
            name = data[part].get("name") if isinstance(data[part], dict) else None
            parts.append(name if isinstance(name, str) and name else f"[{part}]")
            data = data[part]
        else:
            parts.append(f"[{part}]" if isinstance(part, int) else str(part))
            data = data.get(part) if isinstance(data, dict) else None
    return parts, held, ann


def _joined(parts: list[str]) -> str:
    return "".join(p if p.startswith("[") else f".{p}" for p in parts).lstrip(".")


def _bare(ann: Any) -> Any:
    """`ann` without Optional and Annotated: the type a value must have where it is written."""
    while True:
        origin = get_origin(ann)
        if origin is Annotated:
            ann = get_args(ann)[0]
        elif origin in (Union, types.UnionType) and len(rest := [a for a in get_args(ann) if a is not type(None)]) == 1:
            ann = rest[0]
        else:
            return ann


def _allowed(held: Any) -> list[str]:
    if isinstance(held, type) and issubclass(held, BaseModel):
        return [f.alias or n for n, f in held.model_fields.items()] + list(getattr(held, "written_keys", ()))
    return []


def _words(ann: Any) -> str:
    ann = _bare(ann)
    origin = get_origin(ann)
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(a) for a in get_args(ann))
    if origin is list and (item := _bare((get_args(ann) or (None,))[0])) and isinstance(item, type) \
            and issubclass(item, BaseModel):
        return "a list of tables" + (f", each with at least {', '.join(req)}" if (req := _required(item)) else "")
    if origin in (list, tuple) or ann in (list, tuple):
        return "a list [...]"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "a table of keys" + (f", with at least {', '.join(req)}" if (req := _required(ann)) else "")
    if origin is dict or ann is dict:
        return "a table of keys"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            dt.datetime: "a date and time (ISO 8601)"}.get(ann, str(ann))


def _required(model: type[BaseModel]) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items() if f.is_required()]


def _shown(value: Any) -> str:
    """The value as the file wrote it, cut short: enough to find it."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"
