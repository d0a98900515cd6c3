"""Conversation replay: general chat examples trained beside the tasks, with weight 1.

The studies replay previously published conversation data. We cannot fetch any at run time, so the
default source is generated here: procedural conversations whose responses are computed, hence
correct (step-by-step arithmetic, unit conversion, sorting, counting, date arithmetic, checklists).
They are deliberately longer than the JSON task answers, as real chat replies are. A user may supply
their own JSONL instead (`--replay FILE`: one `{"messages": [{"role": ..., "content": ...}, ...]}`
per line, ending with an assistant turn); retention probes then come from rows the replay set does
not use.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from evidence.canonical import canonical_sha256
from evidence.errors import UserError

_WEEK = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_WORDS = ("apple", "river", "candle", "meadow", "lantern", "orbit", "pepper", "quartz", "saddle",
          "timber", "velvet", "walnut", "harbor", "island", "jacket", "kettle", "ladder", "mirror",
          "needle", "oyster", "pillow", "rocket", "silver", "tunnel", "violin", "window", "yogurt")
_UNITS = (("kilometers", "meters", 1000), ("meters", "centimeters", 100), ("hours", "minutes", 60),
          ("kilograms", "grams", 1000), ("liters", "milliliters", 1000), ("minutes", "seconds", 60))
_CHECKLISTS = {
    "preparing for a job interview": ["Research the company and the role",
        "Reread your own resume", "Prepare two or three stories about past work",
        "Write down questions to ask", "Plan the route or test the video link",
        "Lay out clothes the night before", "Sleep well and arrive early"],
    "moving to a new apartment": ["Book the movers or a van", "Collect boxes and tape",
        "Pack one room at a time and label each box", "Update your address with banks and services",
        "Arrange internet and utilities", "Photograph the old place when it is empty",
        "Keep a bag with essentials for the first night"],
    "starting a vegetable garden": ["Pick a spot with six or more hours of sun",
        "Test and loosen the soil", "Choose easy crops such as lettuce, beans and tomatoes",
        "Plan spacing before planting", "Water deeply but not every day", "Mulch to keep moisture",
        "Check for pests weekly"],
    "hosting a small dinner": ["Confirm the guest list and any allergies", "Plan a simple menu",
        "Shop two days ahead", "Prepare what you can in the morning", "Set the table early",
        "Keep drinks and water ready", "Leave time to tidy before guests arrive"],
    "backing up a laptop": ["Decide what must be saved", "Pick an external drive or a cloud service",
        "Run a full first backup", "Schedule automatic backups", "Keep one copy in another place",
        "Test restoring a file", "Repeat the test every few months"],
}


def _arith(rng: random.Random, steps: int) -> tuple[str, str]:
    a, b = rng.randrange(12, 99), rng.randrange(12, 99)
    tens, ones = b // 10 * 10, b % 10
    lines = [f"Let's compute {a} × {b} by splitting {b} into {tens} and {ones}.",
             f"First, {a} × {tens} = {a * tens}.", f"Next, {a} × {ones} = {a * ones}.",
             f"Adding the two parts: {a * tens} + {a * ones} = {a * b}."]
    extra = [f"As a check, {b} × {a} gives the same result, {a * b}, because multiplication is "
             "commutative.",
             f"Another check: {a * b} divided by {a} is {b}, which is where we started.",
             f"Rounding gives an estimate too: about {round(a, -1)} × {round(b, -1)} = "
             f"{round(a, -1) * round(b, -1)}, close to {a * b}.",
             "Splitting a number into tens and ones like this is the same idea as long "
             "multiplication on paper, just written out in words."]
    body = lines + extra[: max(0, steps - 4)]
    return (f"Explain step by step how to compute {a} × {b}.",
            "\n".join(body) + f"\n\nSo {a} × {b} = {a * b}.")


def _convert(rng: random.Random, steps: int) -> tuple[str, str]:
    big, small, factor = rng.choice(_UNITS)
    x = rng.randrange(2, 40)
    frac = rng.choice((0.0, 0.5, 0.25))
    exact = (x + frac) * factor
    value = f"{x + frac:g}"
    result = f"{exact:g}"
    lines = [f"There are {factor} {small} in one unit of {big[:-1] if big.endswith('s') else big}.",
             f"So we multiply {value} by {factor}: {value} × {factor} = {result}.",
             f"That means {value} {big} is {result} {small}."]
    extra = [f"For comparison, {x} {big} alone would be {x * factor} {small}.",
             f"Going back the other way, {result} ÷ {factor} = {value}, so the conversion is "
             "consistent.",
             "When converting from a larger unit to a smaller one, the number always gets bigger.",
             "It helps to write the units next to every number so a mistake shows up at once."]
    return (f"How many {small} are in {value} {big}? Please show the calculation.",
            "\n".join(lines + extra[: max(0, steps - 3)]))


def _sort_words(rng: random.Random, steps: int) -> tuple[str, str]:
    words = rng.sample(_WORDS, min(len(_WORDS), 4 + steps))
    ordered = sorted(words)
    lines = ["To sort words alphabetically, compare their first letters, and where those match, "
             "the next letters."]
    for w in ordered:
        lines.append(f"- {w} (starts with '{w[0]}')")
    return ("Sort these words alphabetically: " + ", ".join(words) + ".",
            "\n".join(lines) + "\n\nSorted list: " + ", ".join(ordered) + ".")


def _count_letters(rng: random.Random, steps: int) -> tuple[str, str]:
    words = rng.sample(_WORDS, min(len(_WORDS), 2 + steps // 2))
    sentence = " ".join(words)
    letter = rng.choice(sorted(set(sentence.replace(" ", ""))))
    lines = [f"Let's go through the sentence \"{sentence}\" word by word and count '{letter}'."]
    total = 0
    for w in words:
        c = w.count(letter)
        total += c
        lines.append(f"- \"{w}\" contains {c} '{letter}'{'s' if c != 1 else ''}; running total {total}.")
    return (f"How many times does the letter '{letter}' appear in \"{sentence}\"?",
            "\n".join(lines) + f"\n\nThe letter '{letter}' appears {total} "
            f"time{'s' if total != 1 else ''}.")


def _weekday(rng: random.Random, steps: int) -> tuple[str, str]:
    start = rng.randrange(7)
    n = rng.randrange(3, 60)
    end = (start + n) % 7
    lines = [f"A week has 7 days, so only the remainder of {n} divided by 7 matters.",
             f"{n} = 7 × {n // 7} + {n % 7}, so the remainder is {n % 7}.",
             f"Counting {n % 7} day{'s' if n % 7 != 1 else ''} forward from {_WEEK[start]} lands on "
             f"{_WEEK[end]}."]
    walk = [_WEEK[(start + i) % 7] for i in range(1, n % 7 + 1)]
    if walk and steps > 3:
        lines.append("Step by step: " + " → ".join([_WEEK[start], *walk]) + ".")
    return (f"If today is {_WEEK[start]}, what day of the week will it be in {n} days?",
            "\n".join(lines) + f"\n\nIt will be {_WEEK[end]}.")


def _checklist(rng: random.Random, steps: int) -> tuple[str, str]:
    topic = rng.choice(sorted(_CHECKLISTS))
    items = _CHECKLISTS[topic][: max(3, min(len(_CHECKLISTS[topic]), steps + 1))]
    body = "\n".join(f"{i}. {item}." for i, item in enumerate(items, 1))
    return (f"Can you give me a short checklist for {topic}?",
            f"Here is a checklist for {topic}:\n\n{body}\n\nTake it one item at a time; you do "
            "not need to finish everything in a single day.")


_KINDS = (_arith, _convert, _sort_words, _count_letters, _weekday, _checklist)


def generate_conversation(seed: int | str, key: str, steps: tuple[int, int],
                          parts: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    """One conversation; with several parts the user asks several questions in one message and
    the reply answers each under its own heading (real chat replies are long; task answers short)."""
    rng = random.Random(f"replay/{seed}/{key}")
    k = rng.randint(*parts)
    makers = [_KINDS[rng.randrange(len(_KINDS))] for _ in range(k)]
    qa = [m(rng, rng.randint(*steps)) for m in makers]
    if k == 1:
        user, assistant = qa[0]
    else:
        user = "I have a few questions.\n" + "\n".join(f"{i}. {q}" for i, (q, _) in enumerate(qa, 1))
        assistant = "\n\n".join(f"**{i}.** {a}" for i, (_, a) in enumerate(qa, 1))
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"id": conversation_id(messages), "kind": "+".join(m.__name__.lstrip("_") for m in makers),
            "messages": messages}


def conversation_id(messages: list[dict[str, str]]) -> str:
    return canonical_sha256(messages)


def generated_pool(seed: int | str, n: int, steps: tuple[int, int], label: str,
                   parts: tuple[int, int] = (1, 1)) -> list[dict[str, Any]]:
    """`n` distinct generated conversations (duplicates by content are skipped)."""
    out, seen, i = [], set(), 0
    while len(out) < n:
        conv = generate_conversation(seed, f"{label}/{i}", steps, parts)
        i += 1
        if conv["id"] not in seen:
            seen.add(conv["id"])
            out.append(conv)
        if i > 50 * n + 1000:
            raise RuntimeError(f"replay generator cannot produce {n} distinct conversations")
    return out


class ReplayFileError(UserError, ValueError):
    pass


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a user-supplied replay file; any unreadable row stops with its line number."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise ReplayFileError(f"replay file {p} is unreadable: {e}") from None
    out, seen = [], set()
    # lines end at LF (and an optional CR) only: JSON strings may hold U+2028, U+0085 … unescaped
    for lineno, line in enumerate((ln.removesuffix("\r") for ln in text.split("\n")), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            msgs = row["messages"]
            ok = (isinstance(msgs, list) and len(msgs) >= 2
                  and all(isinstance(m, dict) and set(m) == {"role", "content"}
                          and m["role"] in ("system", "user", "assistant")
                          and isinstance(m["content"], str) for m in msgs)
                  and msgs[-1]["role"] == "assistant")
        except (json.JSONDecodeError, KeyError, TypeError):
            ok = False
        if not ok:
            raise ReplayFileError(
                f"replay file {p}, line {lineno}: expected {{\"messages\": [{{\"role\", "
                "\"content\"}}, …]}} ending with an assistant turn"
            )
        cid = conversation_id(msgs)
        if cid not in seen:
            seen.add(cid)
            out.append({"id": cid, "kind": "user-file", "messages": msgs})
    return out
