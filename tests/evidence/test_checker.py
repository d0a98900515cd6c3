"""Every checker semantic, tried with hostile answers."""

import pytest

from evidence.checker import INT, INT_OR_NULL, STR, STR_LIST, STR_OR_NULL, check_answer

LOOKUP = ({"sku": STR, "qty": INT_OR_NULL}, {"sku": "A-1000", "qty": 5})
MISSING = ({"sku": STR, "qty": INT_OR_NULL}, {"sku": "A-1000", "qty": None})
ZERO = ({"sku": STR, "qty": INT_OR_NULL}, {"sku": "A-1000", "qty": 0})
STATUS = ({"sku": STR, "status": STR_OR_NULL}, {"sku": "A-1000", "status": "open"})
INVOICE = ({"invoice": STR, "total_cents": INT}, {"invoice": "INV-1", "total_cents": 1200})
ORDER = ({"order": STR_LIST}, {"order": ["T-002", "T-010", "T-001"]})


@pytest.mark.parametrize("text,case,reason", [
    ('{"sku": "A-1000", "qty": 5}', LOOKUP, "ok"),
    ('  \n{"qty": 5, "sku": "A-1000"}\n ', LOOKUP, "ok"),  # whitespace and key order are free
    ('{"sku":"A-1000","qty":5}', LOOKUP, "ok"),
    # malformed JSON
    ('{"sku": "A-1000", "qty": 5', LOOKUP, "malformed_json"),
    ("{'sku': 'A-1000', 'qty': 5}", LOOKUP, "malformed_json"),
    ('', LOOKUP, "malformed_json"),
    ('```json\n{"sku": "A-1000", "qty": 5}\n```', LOOKUP, "malformed_json"),
    ('The answer is {"sku": "A-1000", "qty": 5}', LOOKUP, "malformed_json"),
    # trailing text, including a second object
    ('{"sku": "A-1000", "qty": 5} done', LOOKUP, "trailing_text"),
    ('{"sku": "A-1000", "qty": 5}{"sku": "A-1000", "qty": 5}', LOOKUP, "trailing_text"),
    ('{"sku": "A-1000", "qty": 5}\n```', LOOKUP, "trailing_text"),
    # duplicate keys, also when both values are right, and nested
    ('{"sku": "A-1000", "qty": 5, "qty": 5}', LOOKUP, "duplicate_key:qty"),
    ('{"sku": "A-1000", "qty": 4, "qty": 5}', LOOKUP, "duplicate_key:qty"),
    ('{"order": [{"a": 1, "a": 2}]}', ORDER, "duplicate_key:a"),
    # wrong numeric types
    ('{"sku": "A-1000", "qty": "5"}', LOOKUP, "wrong_type:qty"),
    ('{"sku": "A-1000", "qty": 5.0}', LOOKUP, "wrong_type:qty"),
    ('{"sku": "A-1000", "qty": true}', LOOKUP, "wrong_type:qty"),
    ('{"sku": "A-1000", "qty": 5e0}', LOOKUP, "wrong_type:qty"),
    ('{"invoice": "INV-1", "total_cents": 1200.0}', INVOICE, "wrong_type:total_cents"),
    ('{"invoice": "INV-1", "total_cents": null}', INVOICE, "wrong_type:total_cents"),
    ('{"invoice": 1, "total_cents": 1200}', INVOICE, "wrong_type:invoice"),
    ('{"order": ["T-002", 10, "T-001"]}', ORDER, "wrong_type:order"),
    ('{"order": "T-002,T-010,T-001"}', ORDER, "wrong_type:order"),
    # NaN / Infinity
    ('{"sku": "A-1000", "qty": NaN}', LOOKUP, "non_finite_number"),
    ('{"sku": "A-1000", "qty": Infinity}', LOOKUP, "non_finite_number"),
    ('{"sku": "A-1000", "qty": -Infinity}', LOOKUP, "non_finite_number"),
    # extra / missing keys
    ('{"sku": "A-1000", "qty": 5, "note": "x"}', LOOKUP, "extra_key:note"),
    ('{"sku": "A-1000"}', LOOKUP, "missing_key:qty"),
    ('{}', LOOKUP, "missing_key:sku"),
    # not an object
    ('[{"sku": "A-1000", "qty": 5}]', LOOKUP, "not_an_object"),
    ('5', LOOKUP, "not_an_object"),
    ('"{\\"sku\\": \\"A-1000\\", \\"qty\\": 5}"', LOOKUP, "not_an_object"),
    # missing lookups: null, not 0, not ""; zero quantity: 0, not null
    ('{"sku": "A-1000", "qty": null}', MISSING, "ok"),
    ('{"sku": "A-1000", "qty": 0}', MISSING, "wrong_value:qty"),
    ('{"sku": "A-1000", "qty": null}', ZERO, "wrong_value:qty"),
    ('{"sku": "A-1000", "qty": 0}', ZERO, "ok"),
    ('{"sku": "A-1000", "status": ""}', STATUS, "wrong_value:status"),
    ('{"sku": "A-1000", "status": "Open"}', STATUS, "wrong_value:status"),
    # order matters for lists (ties are part of the expected order)
    ('{"order": ["T-010", "T-002", "T-001"]}', ORDER, "wrong_value:order"),
    ('{"order": ["T-002", "T-010"]}', ORDER, "wrong_value:order"),
    ('{"sku": "A-1001", "qty": 5}', LOOKUP, "wrong_value:sku"),
])
def test_semantics(text, case, reason):
    schema, expected = case
    v = check_answer(text, schema, expected)
    assert v.reason == reason
    assert v.correct is (reason == "ok")


@pytest.mark.parametrize("text,reason", [
    ('{"sku": "A-1000", "qty": ' + "9" * 5000 + '}', "malformed_json"),  # beyond int() limit
    ('\u00a0{"sku": "A-1000", "qty": 5}', "malformed_json"),  # no-break space is not JSON ws
    ('\x1c{"sku": "A-1000", "qty": 5}\x1f', "malformed_json"),
    ('{"sku": "A-1000", "qty": 5}\u2028', "trailing_text"),
    ('{"sku": "A-1000", "qty": 1e400}', "non_finite_number"),
    ('\ufeff{"sku": "A-1000", "qty": 5}', "malformed_json"),
    ('\t\r\n {"sku": "A-1000", "qty": 5} \r\n', "ok"),
])
def test_hostile_edges(text, reason):
    assert check_answer(text, *LOOKUP).reason == reason


def test_deep_nesting_is_malformed_not_a_crash():
    assert check_answer("[" * 100000, *LOOKUP).reason in ("malformed_json", "not_an_object")


# Whole-answer schemas (a user's JSONL cases): a bare JSON number, or exact text.
@pytest.mark.parametrize("text,expected,reason", [
    ("1321", 1321, "ok"),
    (" 1321\n", 1321, "ok"),
    ("1321.0", 1321, "ok"),          # the same number
    ("2.5", 2.5, "ok"),
    ("-7", -7, "ok"),
    ("1312", 1321, "wrong_value"),
    ('"1321"', 1321, "not_a_number"),  # a string of digits is not a number
    ("true", 1, "not_a_number"),     # JSON's true is no number, though Python's bool is an int
    ("null", 0, "not_a_number"),
    ("[1321]", 1321, "not_a_number"),
    ("1321 apples", 1321, "trailing_text"),
    ("The answer is 1321", 1321, "malformed_json"),
    ("NaN", 1321, "non_finite_number"),
    ("1e400", 1321, "non_finite_number"),
    ("0x52A", 1321, "trailing_text"),  # JSON has no hex: the leading 0 is a number, the rest trails
    ("1.321e3", 1321, "ok"),
    ("42.0000000000000001", 42, "wrong_value"),   # exact: not equal once rounded to a binary float
    ("9007199254740993.0", 9007199254740993, "ok"),  # 2**53 + 1: lost by a float, kept as a decimal
    ("0.10", 0.1, "ok"),              # the expected 0.1 is the decimal the file wrote, not its binary float
    ("0.30000000000000004", 0.3, "wrong_value"),
])
def test_a_number_answer(text, expected, reason):
    assert check_answer(text, "number", expected).reason == reason


@pytest.mark.parametrize("text,expected,reason", [
    ("Paris", "Paris", "ok"),
    ("\n Paris \t", "Paris", "ok"),   # only surrounding JSON whitespace is free
    ("paris", "Paris", "wrong_value"),
    ("Paris.", "Paris", "wrong_value"),
    ('"Paris"', "Paris", "wrong_value"),
    ("Paris\u00a0", "Paris", "wrong_value"),  # a no-break space is not JSON whitespace
    ("Pa ris", "Pa ris", "ok"),
    ("", "Paris", "wrong_value"),
])
def test_a_text_answer(text, expected, reason):
    assert check_answer(text, "text", expected).reason == reason


def test_an_unknown_whole_answer_schema_is_refused():
    with pytest.raises(ValueError, match="unknown answer schema 'json'"):
        check_answer("1", "json", 1)
