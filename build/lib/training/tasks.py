"""Executable tasks: four families whose answer is a strict JSON object computed from the prompt.

Family semantics (also stated in every prompt, so the answer is determined by the text alone):
- lookup: report one field (`qty` or `status`) of the record with a given SKU. A SKU that is not
  listed gives `null` for the field — never 0, never an empty string. A listed quantity of 0 is 0.
- filter: the SKUs whose status equals the asked status, in the order the records appear; none
  gives an empty list. Quantity plays no part (a zero-quantity record still matches).
- invoice: the integer total in cents, sum of quantity × unit price over every line; zero-quantity
  lines contribute 0 and are not errors.
- priority: ticket ids from highest priority number to lowest; equal priorities are ordered by
  ascending id (ids are zero-padded, so string order is numeric order).

A task's identity hashes its semantic content (family, records, question) and not its wording, so a
prompt variant of a training task can never pass as a fresh test task. Everything is derived from
`random.Random` seeded by strings, so a seed reproduces the same tasks on any machine.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from evidence.canonical import canonical_sha256
from evidence.checker import INT, INT_OR_NULL, STR, STR_LIST, STR_OR_NULL, check_answer

FAMILIES = ("lookup", "filter", "invoice", "priority")
STATUSES = ("open", "pending", "shipped", "backordered", "cancelled")
_ADJ = ("copper", "steel", "blue", "compact", "heavy", "spare", "quiet", "narrow", "round",
        "bright", "folding", "sealed", "modular", "thermal", "woven", "rigid")
_NOUN = ("valve", "bracket", "lamp", "cable", "pump", "hinge", "filter", "panel", "gear", "sensor",
         "clamp", "spring", "fan", "switch", "gasket", "roller")
_TOPIC = ("login fails", "slow export", "printer jam", "broken link", "missing invoice",
          "disk almost full", "password reset", "wrong timezone", "crash on save", "sync delayed",
          "blank report", "email bounced")

# Prompt variants: (wording, record format). Variants 0-3 are used in training and development;
# 4 and 5 (new wording and new record formats) appear only in the test split.
TRAIN_VARIANTS = (0, 1, 2, 3)
HELDOUT_VARIANTS = (4, 5)
_FORMATS = {0: "json", 1: "table", 2: "kv", 3: "table", 4: "csv", 5: "prose"}


@dataclass
class Task:
    family: str
    records: list[dict[str, Any]]
    question: dict[str, Any]
    answer: dict[str, Any]
    schema: dict[str, str]
    variant: int = 0
    prompt: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        return canonical_sha256(
            {"family": self.family, "records": self.records, "question": self.question}
        )

    @property
    def target(self) -> str:
        return answer_text(self.answer)


def answer_text(answer: dict[str, Any]) -> str:
    """The reference answer as the model should write it."""
    return json.dumps(answer, ensure_ascii=False)


# -- record rendering ------------------------------------------------------------------------
def _render(records: list[dict[str, Any]], fmt: str, prose: Callable[[dict[str, Any]], str]) -> str:
    keys = list(records[0])
    if fmt == "json":
        return "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
    if fmt == "table":
        head = "| " + " | ".join(keys) + " |"
        rule = "|" + "|".join("---" for _ in keys) + "|"
        rows = ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in records]
        return "\n".join([head, rule, *rows])
    if fmt == "kv":
        return "\n".join("; ".join(f"{k}={r[k]}" for k in keys) for r in records)
    if fmt == "csv":
        return "\n".join([",".join(keys), *(",".join(str(r[k]) for k in keys) for r in records)])
    if fmt == "prose":
        return "\n".join(prose(r) for r in records)
    raise ValueError(fmt)


def _sku(rng: random.Random) -> str:
    return f"{rng.choice('ABCDEFGHKMNPRSTW')}-{rng.randrange(1000, 10000)}"


def _name(rng: random.Random) -> str:
    return f"{rng.choice(_ADJ)} {rng.choice(_NOUN)}"


def _quantity(rng: random.Random) -> int:
    return 0 if rng.random() < 0.15 else rng.randrange(1, 60)


def _unique_skus(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        s = _sku(rng)
        if s not in out:
            out.append(s)
    return out


# -- families --------------------------------------------------------------------------------
def _item_prose(r: dict[str, Any]) -> str:
    return f"Item {r['sku']} ({r['name']}) has {r['qty']} units and is {r['status']}."


def _lookup(rng: random.Random, n: int) -> Task:
    skus = _unique_skus(rng, n + 1)
    records = [
        {"sku": s, "name": _name(rng), "qty": _quantity(rng), "status": rng.choice(STATUSES)}
        for s in skus[:n]
    ]
    fld = rng.choice(("qty", "status"))
    missing = rng.random() < 0.25
    target = skus[n] if missing else rng.choice(records)["sku"]
    value = None if missing else next(r[fld] for r in records if r["sku"] == target)
    schema = {"sku": STR, fld: INT_OR_NULL if fld == "qty" else STR_OR_NULL}
    return Task("lookup", records, {"sku": target, "field": fld}, {"sku": target, fld: value}, schema)


def _filter(rng: random.Random, n: int) -> Task:
    records = [
        {"sku": s, "name": _name(rng), "qty": _quantity(rng), "status": rng.choice(STATUSES)}
        for s in _unique_skus(rng, n)
    ]
    present = [r["status"] for r in records]
    status = rng.choice([s for s in STATUSES if s not in present] or STATUSES) if rng.random() < 0.15 \
        else rng.choice(present)
    skus = [r["sku"] for r in records if r["status"] == status]
    return Task("filter", records, {"status": status}, {"status": status, "skus": skus},
                {"status": STR, "skus": STR_LIST})


def _invoice(rng: random.Random, n: int) -> Task:
    records = [
        {"sku": s, "qty": _quantity(rng), "unit_price_cents": rng.randrange(50, 5000)}
        for s in _unique_skus(rng, n)
    ]
    invoice = f"INV-{rng.randrange(1000, 10000)}"
    total = sum(r["qty"] * r["unit_price_cents"] for r in records)
    return Task("invoice", records, {"invoice": invoice}, {"invoice": invoice, "total_cents": total},
                {"invoice": STR, "total_cents": INT})


def _priority(rng: random.Random, n: int) -> Task:
    ids = sorted(rng.sample(range(1, 1000), n))
    rng.shuffle(ids)
    records = [
        {"id": f"T-{i:03d}", "title": rng.choice(_TOPIC), "priority": rng.randrange(1, 5)}
        for i in ids
    ]
    order = [r["id"] for r in sorted(records, key=lambda r: (-r["priority"], r["id"]))]
    return Task("priority", records, {}, {"order": order}, {"order": STR_LIST})


_MAKERS = {"lookup": _lookup, "filter": _filter, "invoice": _invoice, "priority": _priority}


# -- prompts ---------------------------------------------------------------------------------
def _reply(schema_text: str, wording: int) -> str:
    return [
        f"Reply with only a JSON object of the form {schema_text}.",
        f"Answer with a single JSON object, {schema_text}, and nothing else.",
        f"Output exactly one JSON object shaped like {schema_text}; no other text.",
        f"Respond only with JSON: {schema_text}.",
        f"Your whole reply must be one JSON object of the shape {schema_text}.",
        f"Give the result as a bare JSON object {schema_text} with no commentary.",
    ][wording]


def render_prompt(task: Task, variant: int) -> str:
    fmt = _FORMATS[variant]
    w = variant
    q = task.question
    if task.family == "lookup":
        block = _render(task.records, fmt, _item_prose)
        fld = q["field"]
        what = "quantity (qty)" if fld == "qty" else "status"
        kind = "an integer" if fld == "qty" else "a string"
        shape = f'{{"sku": "{q["sku"]}", "{fld}": ...}}'
        lead = [
            f"Inventory records:\n{block}\n\nWhat is the {what} of SKU {q['sku']}?",
            f"Here is the stock list.\n{block}\n\nLook up SKU {q['sku']} and report its {what}.",
            f"{block}\n\nFrom the records above, find the {what} for SKU {q['sku']}.",
            f"Stock records follow.\n{block}\nTask: give the {what} of {q['sku']}.",
            f"Warehouse export:\n{block}\n\nPlease retrieve the {what} recorded for {q['sku']}.",
            f"Record notes:\n{block}\n\nI need the {what} on file for product {q['sku']}.",
        ][w]
        rule = (f"The {fld} value is {kind}; if the SKU is not listed, use null. "
                "A listed quantity of 0 is 0.")
    elif task.family == "filter":
        block = _render(task.records, fmt, _item_prose)
        shape = f'{{"status": "{q["status"]}", "skus": [...]}}'
        lead = [
            f"Inventory records:\n{block}\n\nWhich SKUs have status {q['status']}?",
            f"Here is the stock list.\n{block}\n\nList every SKU whose status is {q['status']}.",
            f"{block}\n\nSelect the SKUs with status \"{q['status']}\" from the records above.",
            f"Stock records follow.\n{block}\nTask: filter for status {q['status']}.",
            f"Warehouse export:\n{block}\n\nCollect the SKUs currently marked {q['status']}.",
            f"Record notes:\n{block}\n\nFind all products whose status reads {q['status']}.",
        ][w]
        rule = ("Keep the order in which the records appear; quantity does not matter; "
                "if none match, use an empty list.")
    elif task.family == "invoice":
        block = _render(task.records, fmt, lambda r: (
            f"Line {r['sku']}: {r['qty']} units at {r['unit_price_cents']} cents each."))
        shape = f'{{"invoice": "{q["invoice"]}", "total_cents": ...}}'
        lead = [
            f"Invoice {q['invoice']} lines:\n{block}\n\nWhat is the invoice total in cents?",
            f"Here are the lines of invoice {q['invoice']}.\n{block}\n\nCompute the total in cents.",
            f"{block}\n\nThese are the lines of {q['invoice']}. Add up the total in cents.",
            f"Invoice {q['invoice']}.\n{block}\nTask: total amount in cents.",
            f"Billing extract for {q['invoice']}:\n{block}\n\nWork out how many cents it totals.",
            f"Invoice notes for {q['invoice']}:\n{block}\n\nSum the charges, in cents.",
        ][w]
        rule = ("The total is the sum of qty times unit_price_cents over all lines, as an integer; "
                "lines with qty 0 add nothing.")
    elif task.family == "priority":
        block = _render(task.records, fmt, lambda r: (
            f"Ticket {r['id']} \"{r['title']}\" has priority {r['priority']}."))
        shape = '{"order": [...]}'
        lead = [
            f"Support tickets:\n{block}\n\nOrder the ticket ids by priority.",
            f"Here is the ticket queue.\n{block}\n\nSort the ticket ids by priority.",
            f"{block}\n\nRank the tickets above by priority.",
            f"Tickets follow.\n{block}\nTask: priority order of the ids.",
            f"Queue snapshot:\n{block}\n\nArrange these ticket ids by urgency.",
            f"Ticket notes:\n{block}\n\nPut the ticket ids in the order they should be handled.",
        ][w]
        rule = ("Higher priority numbers come first; equal priorities are ordered by ascending "
                "ticket id.")
    else:  # pragma: no cover - families are fixed
        raise ValueError(task.family)
    return f"{lead}\n{rule} {_reply(shape, w)}"


# -- generation ------------------------------------------------------------------------------
def generate_task(seed: int | str, key: str, family: str, variant: int,
                  records: tuple[int, int]) -> Task:
    """One task, fully determined by (seed, key, family)."""
    rng = random.Random(f"task/{seed}/{key}/{family}")
    n = rng.randint(records[0], records[1])
    task = _MAKERS[family](rng, n)
    task.variant = variant
    task.prompt = render_prompt(task, variant)
    verdict = check_answer(task.target, task.schema, task.answer)
    if not verdict.correct:  # the generator must never emit a target its own checker rejects
        raise AssertionError(f"generated target fails the checker: {verdict.reason}")
    return task


def damage(task: Task, rng: random.Random) -> dict[str, Any]:
    """A plausible but wrong answer of the same schema, for the damaged-target control."""
    for _ in range(100):
        a = json.loads(json.dumps(task.answer))
        if task.family == "lookup":
            fld = task.question["field"]
            if fld == "qty":
                a[fld] = (a[fld] or 0) + rng.choice((-3, -2, -1, 1, 2, 3, 5))
                a[fld] = max(a[fld], 0) if rng.random() < 0.5 else a[fld]
            else:
                a[fld] = rng.choice([s for s in STATUSES if s != a[fld]])
        elif task.family == "filter":
            others = [r["sku"] for r in task.records if r["sku"] not in a["skus"]]
            if a["skus"] and (not others or rng.random() < 0.5):
                a["skus"].pop(rng.randrange(len(a["skus"])))
            else:
                a["skus"].insert(rng.randrange(len(a["skus"]) + 1), rng.choice(others))
        elif task.family == "invoice":
            line = rng.choice(task.records)
            a["total_cents"] += rng.choice((-1, 1)) * max(line["unit_price_cents"], 1)
        elif task.family == "priority":
            if len(a["order"]) > 1:
                i = rng.randrange(len(a["order"]) - 1)
                a["order"][i], a["order"][i + 1] = a["order"][i + 1], a["order"][i]
        if not check_answer(answer_text(a), task.schema, task.answer).correct:
            return a
    raise AssertionError("could not damage task")
