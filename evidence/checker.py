"""The strict answer checker.

A case's schema is one of three forms: a JSON object's fields (`{"key": type}`, the generated
families' and any JSONL object answer's), `"number"` (one bare JSON number) or `"text"` (exact text).

An object answer is correct only if it is exactly one JSON object whose keys and value types match
the schema and whose values equal the expected ones. The semantics, in the order checked:

1. Surrounding JSON whitespace (space, tab, LF, CR) is ignored; nothing else is (no code fences, no
   prose, no other Unicode spaces). Text left after the first complete JSON value is `trailing_text`.
2. Text that does not parse as JSON is `malformed_json` (so are integers longer than Python's
   4,300-digit conversion limit); `NaN`, `Infinity`, `-Infinity` (which Python's json accepts but
   JSON forbids) and numbers that overflow to infinity (`1e400`) are `non_finite_number`.
3. A repeated key in any object, at any depth, is `duplicate_key` (parsers disagree on which value
   wins, so no answer may rely on it).
4. A top-level value that is not an object is `not_an_object`.
5. Keys: a missing one is `missing_key:<k>`, an unexpected one `extra_key:<k>`. Key order is free.
6. Types: an integer field accepts only JSON integers — `"5"`, `5.0` and `true` are all
   `wrong_type:<k>` (Python's bool is an int, so the check is on the exact type). Nullable fields
   accept `null`; string fields only strings; list fields only lists of strings.
7. Values: anything else that differs from the expected object is `wrong_value:<k>`.

A `"number"` answer follows rules 1–3, then must be a JSON number (`"5"`, `true`, `null`, a list
are `not_a_number`) equal to the expected one as an exact decimal (`5`, `5.0` and `5e0` are the same
number; `5.0000000000000001` is not), else `wrong_value`. A `"text"` answer is the expected text exactly, once surrounding JSON whitespace is
stripped from both, else `wrong_value`: no case, spacing or punctuation is forgiven inside it.

A reason that names a key is `<kind>:<key>` (`wrong_value:total`): the kind before the first `:`, the
key after it — a field of the schema (`missing_key`, `wrong_type`, `wrong_value`) or, for `extra_key`
and `duplicate_key`, a key the answer wrote. `failure_counts` and `reason_parts` read them so.

The family semantics the expected answers follow (missing lookups are `null`, zero quantities are
0 and still count as listed, ties in priority order break by ascending id) live in `tasks.py`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

# Field type codes used in schemas.
INT, INT_OR_NULL, STR, STR_OR_NULL, STR_LIST = "int", "int|null", "str", "str|null", "list[str]"
FIELD_TYPES = (INT, INT_OR_NULL, STR, STR_OR_NULL, STR_LIST)
# Whole-answer schemas: a bare JSON number, or exact text.
NUMBER, TEXT = "number", "text"


@dataclass(frozen=True)
class Verdict:
    correct: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"correct": self.correct, "reason": self.reason}


class _Duplicate(ValueError):
    pass


class _NonFinite(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _constant(name: str) -> Any:
    raise _NonFinite(name)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NonFinite(text)
    return value


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)
JSON_WS = " \t\n\r"  # the only whitespace an answer may carry around it


def parse_strict(text: str) -> tuple[Any, str | None]:
    """Parse one JSON value; return (value, None) or (None, reason)."""
    s = text.strip(JSON_WS)
    try:
        value, end = _DECODER.raw_decode(s)
    except _Duplicate as e:
        return None, f"duplicate_key:{e}"
    except _NonFinite:
        return None, "non_finite_number"
    except (json.JSONDecodeError, RecursionError, ValueError):
        return None, "malformed_json"
    if s[end:].strip(JSON_WS):
        return None, "trailing_text"
    return value, None


def _type_ok(code: str, v: Any) -> bool:
    if code == INT:
        return type(v) is int
    if code == INT_OR_NULL:
        return v is None or type(v) is int
    if code == STR:
        return type(v) is str
    if code == STR_OR_NULL:
        return v is None or type(v) is str
    if code == STR_LIST:
        return type(v) is list and all(type(x) is str for x in v)
    raise ValueError(f"unknown schema type {code}")


def is_number(v: Any) -> bool:
    return type(v) in (int, float)


def check_answer(text: str, schema: dict[str, str] | str, expected: Any) -> Verdict:
    if schema == TEXT:
        if type(expected) is not str:
            raise ValueError("a text schema's expected answer is a string")
        ok = text.strip(JSON_WS) == expected.strip(JSON_WS)
        return Verdict(ok, "ok" if ok else "wrong_value")
    if isinstance(schema, str) and schema != NUMBER:
        raise ValueError(f"unknown answer schema {schema!r} (an object's fields, {NUMBER!r} or {TEXT!r})")
    value, problem = parse_strict(text)
    if problem:
        return Verdict(False, problem)
    if schema == NUMBER:
        if not is_number(value):
            return Verdict(False, "not_a_number")
        # exactly, as decimals: the text is the number's one token (binary floats would call
        # 42.0000000000000001 right for 42, and 9007199254740993.0 wrong for 9007199254740993)
        same = Decimal(text.strip(JSON_WS)) == (Decimal(repr(expected)) if type(expected) is float else Decimal(expected))
        return Verdict(True, "ok") if same else Verdict(False, "wrong_value")
    if not isinstance(value, dict):
        return Verdict(False, "not_an_object")
    for k in schema:
        if k not in value:
            return Verdict(False, f"missing_key:{k}")
    for k in value:
        if k not in schema:
            return Verdict(False, f"extra_key:{k}")
    for k, code in schema.items():
        if not _type_ok(code, value[k]):
            return Verdict(False, f"wrong_type:{k}")
    for k in schema:
        if value[k] != expected[k]:
            return Verdict(False, f"wrong_value:{k}")
    return Verdict(True, "ok")


def fields_wrong(text: str, schema: dict[str, str] | str, expected: Any) -> list[str]:
    """Every field of an object answer that is wrong in any way (missing, of the wrong type, or of another
    value), in the schema's order; [] where the answer is no JSON object or the schema none. The verdict
    names only the first failing field; a researcher asking "which fields does the model get wrong" needs
    each (the report's `wrong_fields`)."""
    if not isinstance(schema, dict):
        return []
    value, problem = parse_strict(text)
    if problem or not isinstance(value, dict):
        return []
    return [k for k, code in schema.items()
            if k not in value or not _type_ok(code, value[k]) or value[k] != expected[k]]


def reason_parts(reason: str) -> tuple[str, str | None]:
    """A reason's kind and the key it names (None where it names none): `wrong_value:total` →
    (`wrong_value`, `total`); `malformed_json` → (`malformed_json`, None)."""
    kind, sep, key = reason.partition(":")
    return kind, key if sep else None


def failure_counts(reasons: Iterable[str]) -> dict[str, int]:
    """Wrong answers by their reason, `{reason: count}` with the reasons sorted: what an evaluation's
    summary keeps (`failures`) and the report breaks down (evidence/report/compute.py)."""
    return dict(sorted(Counter(reasons).items()))
