"""Where an experiment's task cases come from: the generated families, or the user's own JSONL file.

A source hands `prepare` the train, dev and test cases (as `inputs/tasks.jsonl` rows) and, for the
damaged-target control, wrong answers for some training cases. Everything downstream — the
commitments, the strict checker, scoring, the report's re-check, serving — reads only those rows
(`prompt`, `answer`, `schema`, `target`), so it works unchanged on either source.

A JSONL file (`task_file` in the experiment) has one case per line:

    {"prompt": "What is 17 + 25?", "answer": 42}
    {"prompt": "Capital of France?", "answer": "Paris", "wrong_answer": "Lyon", "split": "test"}
    {"prompt": "…", "answer": {"total": 12, "unit": "kg"}, "schema": {"total": "int", "unit": "str"}}

`schema` says how an answer is checked (`evidence.checker`): `"number"` (one bare JSON number),
`"text"` (exact text) or an object's fields and types; left out, it follows the answer (a number, a
string, an object of integers, strings and lists of strings). `wrong_answer` is a plausible wrong
answer of the same schema, trained on by the damaged-target control. `split` (train, dev or test)
is given on every line or on none; without it the cases are split by the experiment's generator
seed. `family` groups cases in the answers (default "jsonl"); `id` (a string or an integer, each
case's own) is kept with the case and its answers. Any other key, a repeated prompt or id, an answer
its own schema refuses, or a wrong answer the checker accepts is refused with its line number:
nothing in the file is silently dropped or reinterpreted.

Where a profile takes fewer cases than a split holds, the cases are drawn, never taken in file order
(a file sorted by date, difficulty or source would bias the study): a seeded draw per split,
stratified by family, from the experiment's generator seed — or the exact ids a profile pins
(`case_ids`). The rule is recorded in prepared.json's `task_source.draw`; a home prepared before
rules were recorded (no `draw`) keeps the one it was prepared by (`JsonlFile(legacy=True)`: a
labelled file's first cases in file order), so it re-prepares and recomputes as it was.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from collections import Counter
from typing import Any, Callable, NamedTuple, Protocol

from evidence.canonical import canonical_sha256
from evidence.checker import FIELD_TYPES, INT, JSON_WS, NUMBER, STR, STR_LIST, TEXT, check_answer, is_number
from evidence.errors import UserError
from evidence.inputs import drawn  # noqa: F401 — said where a task source is shown
from training.tasks import FAMILIES, HELDOUT_VARIANTS, TRAIN_VARIANTS, damage, generate_task

SPLITS = ("train", "dev", "test")
JSONL_KEYS = {"prompt", "answer", "schema", "wrong_answer", "split", "family", "id"}


class TaskFileError(UserError, ValueError):
    """The user's task file cannot be used; the message names the file, the line and the fix."""

    findings: list["Finding"] = []  # every one found in the pass (`refusal`), where the file was read


def target_text(answer: Any, schema: dict[str, str] | str) -> str:
    """The reference answer as the model should write it: exact text as is, anything else as JSON."""
    return answer if schema == TEXT else json.dumps(answer, ensure_ascii=False)


class TaskSource(Protocol):
    collisions: int  # generated cases skipped as repeats (prepared.json's `generator_collisions_skipped`)
    warnings: list["Finding"]  # what is used as written but said wherever the source is read

    def describe(self) -> dict[str, Any] | None:
        """What prepared.json commits about the source (None: the generated families, as before)."""

    def cases(self, counts: dict[str, int]) -> list[dict[str, Any]]:
        """`counts[split]` rows per split, in train, dev, test order, each with its case_id."""

    def damage(self, rows: list[dict[str, Any]], n: int, seed: int, *, required: bool) -> dict[int, Any]:
        """Wrong answers for `n` of the training rows, by index; `required`: an arm trains on them,
        so a source without enough refuses (else it gives what it has)."""


# -- the generated families -------------------------------------------------------------------
class Generated:
    """The four families of `training.tasks`, unique across splits, held-out wordings in test."""

    def __init__(self, seed: int, records: tuple[int, int], heldout_fraction: float):
        self.seed, self.records, self.heldout_fraction = seed, records, heldout_fraction
        self.collisions = 0
        self.warnings: list[Finding] = []
        self._tasks: list[Any] = []

    def describe(self) -> None:
        return None

    def cases(self, counts: dict[str, int]) -> list[dict[str, Any]]:
        identities: set[str] = set()
        prompts: set[str] = set()
        self._tasks, self.collisions = [], 0

        def train_variant(i: int) -> int:
            return TRAIN_VARIANTS[(i // len(FAMILIES)) % len(TRAIN_VARIANTS)]

        def test_variant(i: int) -> int:
            j = i // len(FAMILIES)  # the i-th case's family cycles with i, so decide per round
            heldout = int((j + 1) * self.heldout_fraction) > int(j * self.heldout_fraction)
            pool = HELDOUT_VARIANTS if heldout else TRAIN_VARIANTS
            return pool[(j // 2) % len(pool)]

        rows: list[dict[str, Any]] = []
        for split in SPLITS:
            variant_of = test_variant if split == "test" else train_variant
            made, i = 0, 0
            while made < counts[split]:
                family = FAMILIES[made % len(FAMILIES)]
                task = generate_task(self.seed, f"{split}/{i}", family, variant_of(made), self.records)
                i += 1
                ph = prompt_hash(task.prompt)
                if task.identity in identities or ph in prompts:
                    self.collisions += 1
                    continue
                identities.add(task.identity)
                prompts.add(ph)
                if split == "train":
                    self._tasks.append(task)
                rows.append({"case_id": f"{split}-{made:05d}", "split": split, "task_id": task.identity,
                             "family": task.family, "variant": task.variant,
                             "heldout_variant": task.variant in HELDOUT_VARIANTS, "prompt": task.prompt,
                             "answer": task.answer, "schema": task.schema, "target": task.target,
                             "records": task.records, "question": task.question})
                made += 1
        return rows

    def damage(self, rows: list[dict[str, Any]], n: int, seed: int, *, required: bool) -> dict[int, Any]:
        rng = random.Random(f"damage/{seed}")
        return {i: damage(self._tasks[i], rng) for i in sorted(rng.sample(range(len(self._tasks)), n))}


def prompt_hash(prompt: str) -> str:
    return canonical_sha256({"prompt": prompt})


# -- the user's JSONL file --------------------------------------------------------------------
def _inferred_schema(answer: Any) -> dict[str, str] | str | None:
    if type(answer) is str:
        return TEXT
    if is_number(answer):
        return NUMBER
    if isinstance(answer, dict) and answer:
        fields = {}
        for k, v in answer.items():
            if type(v) is int:
                fields[k] = INT
            elif type(v) is str:
                fields[k] = STR
            elif type(v) is list and all(type(x) is str for x in v):
                fields[k] = STR_LIST
            else:
                return None
        return fields
    return None


def _untold_field(answer: Any) -> str | None:
    """The first field of an object answer whose type no schema field type takes, said with what it holds:
    a refusal that names the field, not only the answer."""
    if not isinstance(answer, dict):
        return None
    for k, v in answer.items():
        if not (type(v) in (int, str) or (type(v) is list and all(type(x) is str for x in v))):
            what = ("an object" if isinstance(v, dict) else "a list with a non-string item" if isinstance(v, list)
                    else "null" if v is None else f"a {type(v).__name__}")
            return f"field {json.dumps(k, ensure_ascii=False)} holds {what}"
    return None


def _schema_ok(schema: Any) -> bool:
    if schema in (TEXT, NUMBER):
        return True
    return (isinstance(schema, dict) and bool(schema)
            and all(isinstance(k, str) and v in FIELD_TYPES for k, v in schema.items()))


class Finding(NamedTuple):
    """One thing wrong with a task file: its line (None: the file as a whole) and what, with the fix."""

    line: int | None
    what: str


FINDINGS_SHOWN = 20
"""A refusal lists this many findings and counts the rest: every bad line of a file in one pass,
without a thousand-line message for a file that is wrong throughout."""


def refusal(path: Path, findings: list[Finding]) -> TaskFileError:
    """Every finding of one pass as one refusal: a single one on one line, as it always was."""
    def at(f: Finding) -> str:
        return f"line {f.line}: {f.what}" if f.line is not None else f.what

    if len(findings) == 1:
        f = findings[0]
        err = TaskFileError(f"task file {path}, {at(f)}" if f.line is not None else f"task file {path}: {f.what}")
    else:
        more = len(findings) - FINDINGS_SHOWN
        err = TaskFileError(f"task file {path}: {len(findings)} problems"
                            + (f" (the first {FINDINGS_SHOWN} below, {more} more)" if more > 0 else "")
                            + "; fix every one, then validate again:\n"
                            + "\n".join(f"  {at(f)}" for f in findings[:FINDINGS_SHOWN]))
    err.findings = findings
    return err


def _int_or(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def _id_key(value: Any) -> str | None:
    """One key per id, its type kept (the id 5 and the id "5" are two ids, as the file wrote them)."""
    return None if value is None else json.dumps(value, ensure_ascii=False)


class _Bad(Exception):
    """One line refused, for `JsonlFile._read` to collect."""


def check_kind(schema: dict[str, str] | str) -> str:
    """How an answer is checked, in a word: what one family's answers must share."""
    return schema if isinstance(schema, str) else "object"


class JsonlFile:
    """The user's cases, read and checked line by line when the source is made; every line refused
    is found in the one pass (`TaskFileError.findings`)."""

    def __init__(self, path: Path, seed: int, measure: Callable[[list[dict[str, Any]]], list[Finding]] | None = None,
                 *, pinned: Path | None = None, legacy: bool = False):
        """`measure`: findings about the cases read (their length in tokens, which needs the model's
        tokenizer), made in the same pass as the lines' own, so a file is judged whole at once.
        `pinned`: the profile's `case_ids` file; `legacy`: the rule of a home prepared before rules were
        recorded (its prepared.json's task_source has no `draw`), so that home prepares as it was."""
        self.path, self.seed, self.measure, self.pinned, self.legacy = Path(path), seed, measure, pinned, legacy
        self.collisions = 0
        self.rows = self._read()
        self.used: dict[str, int] = {}
        self.draw: dict[str, Any] | None = None  # how `plan` chose the cases (prepared.json's task_source.draw)

    @staticmethod
    def _plain_text(key: str, text: str) -> None:
        """A text answer is trained as written and checked with surrounding whitespace stripped: an
        empty one, or one that begins or ends with whitespace, could never be told to the model."""
        if not text.strip(JSON_WS):
            raise _Bad(f"an empty \"text\" {key} (the model's empty reply would count as it)")
        if text != text.strip(JSON_WS):
            raise _Bad(f"a \"text\" {key} may not begin or end with whitespace (the checker "
                       "ignores it in answers, so the model could not be told it)")

    def _case(self, lineno: int, line: str) -> dict[str, Any]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise _Bad(f"not JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(row, dict):
            raise _Bad("expected an object {\"prompt\": …, \"answer\": …}")
        if extra := sorted(set(row) - JSONL_KEYS):
            raise _Bad(f"unknown key(s) {', '.join(extra)} (a case takes {', '.join(sorted(JSONL_KEYS))})")
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise _Bad("\"prompt\" must be a non-empty string")
        if "answer" not in row:
            raise _Bad("no \"answer\"")
        answer = row["answer"]
        schema = row.get("schema", _inferred_schema(answer))
        if schema is None:
            field = _untold_field(answer)
            raise _Bad("the answer's schema cannot be told from the answer"
                       + (f": its {field}, and a field is an integer, a string or a list of strings (nested "
                          "objects are not checked: flatten them into fields of their own)" if field else "")
                       + f" (give \"schema\": \"number\", \"text\", or an object's fields typed {', '.join(FIELD_TYPES)})")
        if not _schema_ok(schema):
            raise _Bad(f"\"schema\" {json.dumps(schema)} is none of \"number\", \"text\" or an "
                       f"object's fields typed {', '.join(FIELD_TYPES)}")
        if schema == TEXT and type(answer) is not str:
            raise _Bad("a \"text\" answer must be a string")
        target = target_text(answer, schema)
        if not (v := check_answer(target, schema, answer)).correct:
            raise _Bad(f"the answer fails its own schema ({v.reason})")
        if schema == TEXT:
            self._plain_text("answer", answer)
        case: dict[str, Any] = {"line": lineno, "prompt": prompt, "answer": answer, "schema": schema,
                                "target": target, "id": row.get("id"),
                                "family": row.get("family", "jsonl"), "split": row.get("split"),
                                "schema_given": "schema" in row}
        if not isinstance(case["family"], str) or not case["family"]:
            raise _Bad("\"family\" must be a non-empty string")
        if case["split"] is not None and case["split"] not in SPLITS:
            raise _Bad(f"\"split\" must be one of {', '.join(SPLITS)}, not {json.dumps(case['split'], ensure_ascii=False)}")
        if (not self.legacy and case["id"] is not None
                and not (type(case["id"]) is int or (isinstance(case["id"], str) and case["id"]))):
            raise _Bad(f"\"id\" must be a non-empty string or an integer, not {json.dumps(case['id'], ensure_ascii=False)}")
        if "wrong_answer" in row:
            wrong = row["wrong_answer"]
            if schema == TEXT and type(wrong) is not str:
                raise _Bad("a \"text\" case's wrong_answer must be a string")
            if schema == TEXT:
                self._plain_text("wrong_answer", wrong)
            v = check_answer(target_text(wrong, schema), schema, answer)
            if v.correct:
                raise _Bad("\"wrong_answer\" is accepted as correct by the checker")
            if v.reason != "wrong_value" and not v.reason.startswith("wrong_value:"):
                raise _Bad(f"\"wrong_answer\" is not an answer of the case's schema ({v.reason}): "
                           "the damaged control trains on well-formed wrong answers")
            case["wrong_answer"] = wrong
        return case

    def _read(self) -> list[dict[str, Any]]:
        try:  # one read: the hash committed is of the very bytes the cases come from
            data = self.path.read_bytes()
            text = data.decode("utf-8-sig")
        except (OSError, UnicodeDecodeError) as e:
            raise TaskFileError(f"task file {self.path} is unreadable: {e}") from None
        self.sha256 = hashlib.sha256(data).hexdigest()
        out: list[dict[str, Any]] = []
        found: list[Finding] = []
        first_line: dict[str, int] = {}
        id_line: dict[str, int] = {}
        # lines end at LF (and an optional CR) only: JSON strings may hold U+2028, U+0085 … unescaped
        for lineno, line in enumerate(text.split("\n"), 1):
            line = line.removesuffix("\r")
            if not line.strip():
                continue
            try:
                case = self._case(lineno, line)
                if case["prompt"] in first_line:
                    raise _Bad(f"the prompt of line {first_line[case['prompt']]} again (every case is scored "
                               "once: a repeated prompt would count twice or cross splits)")
                if (key := _id_key(case["id"])) in id_line and not self.legacy:
                    raise _Bad(f"the id {json.dumps(case['id'], ensure_ascii=False)} of line {id_line[key]} again "
                               "(an id names one case: its answers, `training check --case` and `case_ids` find it)")
            except _Bad as e:
                found.append(Finding(lineno, str(e)))
                continue
            first_line[case["prompt"]] = lineno
            if key is not None:
                id_line.setdefault(key, lineno)
            out.append(case)
        if not out and not found:
            found.append(Finding(None, "it holds no cases (it is empty, or only blank lines): one JSON object "
                                       "{\"prompt\": …, \"answer\": …} per line"))
        self.warnings = self._mixed_checks(out)
        if self.measure is not None and out:
            found += self.measure(out)
        labelled = [c for c in out if c["split"] is not None]
        if labelled and len(labelled) != len(out):
            unl = next(c for c in out if c["split"] is None)
            found.append(Finding(None, f"{len(labelled)} of {len(out)} cases give a \"split\" (line {unl['line']} "
                                       "does not): give it on every line or on none"))
        if found:
            raise refusal(self.path, sorted(found, key=lambda f: (f.line is not None, f.line or 0)))
        return out

    @staticmethod
    def _mixed_checks(cases: list[dict[str, Any]]) -> list[Finding]:
        """Warnings, one per family whose answers (where the check was told from the answer) are not
        checked alike: a bare number among text answers is a slip as often as a choice, and it is
        scored by another rule than its neighbours. Not refused — a family may mean to mix — but said
        by name wherever the file is read, with the lines of the fewer kind. A line that gives its
        "schema" says it means it."""
        kinds: dict[str, list[dict[str, Any]]] = {}
        for c in cases:
            if not c["schema_given"]:
                kinds.setdefault(c["family"], []).append(c)
        found = []
        for family, cs in kinds.items():
            lines: dict[str, list[int]] = {}
            for c in cs:
                lines.setdefault(check_kind(c["schema"]), []).append(c["line"])
            if len(lines) < 2:
                continue
            order = sorted(lines, key=lambda k: (-len(lines[k]), lines[k][0]))  # most first; a tie: written first
            fewer = [f"{k} on line(s) {', '.join(map(str, lines[k][:8]))}{' …' if len(lines[k]) > 8 else ''}"
                     for k in order[1:]]
            found.append(Finding(lines[order[1]][0], f"family '{family}' mixes how answers are checked: "
                                 f"{', '.join(f'{k} ×{len(lines[k])}' for k in order)} ({'; '.join(fewer)}): if "
                                 "that is a slip, write them as the others; if not, give them a \"family\" of "
                                 "their own or a \"schema\""))
        return found

    def checks(self) -> dict[str, dict[str, int]]:
        """How the answers are checked, per family: {family: {"text": n, "number (given)": m, …}} — what
        `validate` shows, so that no answer is checked by a rule its writer did not see."""
        out: dict[str, Counter[str]] = {}
        for c in self.rows:
            out.setdefault(c["family"], Counter())[check_kind(c["schema"]) + (" (given)" if c["schema_given"] else "")] += 1
        return {f: dict(sorted(k.items())) for f, k in out.items()}

    def shapes(self) -> dict[str, dict[str, Any]]:
        """Per family, what its answers must be and how the model is taught to write one: each distinct
        schema with its count (an object's fields with their types, as given or inferred from the
        answer) and the first case's training text exactly as it is trained (`target`, JSON in the file's
        key order for an object). What `validate` shows, so a researcher sees the fields the checker
        will demand before any run."""
        out: dict[str, dict[str, Any]] = {}
        for c in self.rows:
            fam = out.setdefault(c["family"], {"schemas": [], "example": {"line": c["line"], "id": c["id"],
                                                                          "target": c["target"]}})
            for entry in fam["schemas"]:
                if entry["schema"] == c["schema"] and entry["given"] == c["schema_given"]:
                    entry["cases"] += 1
                    break
            else:
                fam["schemas"].append({"schema": c["schema"], "given": c["schema_given"], "cases": 1})
        return out

    def describe(self) -> dict[str, Any]:
        out = {"kind": "jsonl", "file": self.path.name, "sha256": self.sha256, "cases": len(self.rows),
               "split_by": "file" if self.labelled else "generator_seed",
               "used": dict(self.used), "unused": len(self.rows) - sum(self.used.values()),
               "wrong_answers": sum("wrong_answer" in c for c in self.rows)}
        if self.draw is not None:  # a home prepared before rules were recorded keeps its form
            out["draw"] = self.draw
        return out

    @property
    def labelled(self) -> bool:
        return bool(self.rows) and self.rows[0]["split"] is not None

    def plan(self, counts: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
        """The cases of each split: the ids the profile pins; else, in a file that labels its splits, a
        seeded draw per split, stratified by family (`_drawn`); else test, dev, then train drawn from one
        shuffle by the generator seed. Sets `draw`, the rule as prepared.json records it."""
        if self.pinned is not None:
            plan = self._pinned(counts)
            self.draw = {"rule": "pinned", "file": self.pinned.name, "sha256": self._pins_sha256,
                         "from": self._split_sizes()}
            return plan
        if self.labelled:
            by = {s: [c for c in self.rows if c["split"] == s] for s in SPLITS}
            short = [f"{s}: {len(by[s])} of {counts[s]}" for s in SPLITS if len(by[s]) < counts[s]]
            if short:
                none = [s for s in SPLITS if not by[s] and counts[s]]
                raise TaskFileError(f"task file {self.path} has too few cases for the profile ({'; '.join(short)}): "
                                    "add cases or lower the profile's tasks, dev and test"
                                    + ("; a file without dev cases runs with the profile's dev = 0 (the serving "
                                       "probe, whose requests are dev cases, is then not run)" if none == ["dev"] else ""))
            if self.legacy:
                return {s: by[s][:counts[s]] for s in SPLITS}
            plan, families = {}, {}
            for s in SPLITS:
                plan[s], families[s] = self._drawn(s, by[s], counts[s])
            self.draw = {"rule": "seeded", "seed": self.seed, "stratified_by": "family",
                         "from": self._split_sizes(), "families": families}
            return plan
        need = sum(counts.values())
        if len(self.rows) < need:
            raise TaskFileError(f"task file {self.path} has {len(self.rows)} cases; the profile needs "
                                f"{counts['train']} train + {counts['dev']} dev + {counts['test']} test = {need}: "
                                "add cases or lower the profile's tasks, dev and test")
        order = list(self.rows)
        random.Random(f"jsonl-split/{self.seed}").shuffle(order)
        test, dev = order[:counts["test"]], order[counts["test"]:counts["test"] + counts["dev"]]
        train = order[counts["test"] + counts["dev"]:need]
        if not self.legacy:
            self.draw = {"rule": "shuffled", "seed": self.seed, "from": {"file": len(self.rows)}}
        return {"train": train, "dev": dev, "test": test}

    def _split_sizes(self) -> dict[str, int]:
        if not self.labelled:
            return {"file": len(self.rows)}
        return {s: sum(c["split"] == s for c in self.rows) for s in SPLITS}

    def _drawn(self, split: str, pool: list[dict[str, Any]], k: int) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
        """`k` of a split's cases, drawn without regard to their place in the file: each family gets its
        share of `k` (by largest remainder, a tie to the family written first), drawn from its own seeded
        generator, so one family's cases never move another's. Returned in file order, with {family:
        [drawn, of]}. The same on every machine: `random.Random` with a string seed is fixed by Python."""
        fams: dict[str, list[dict[str, Any]]] = {}
        for c in pool:
            fams.setdefault(c["family"], []).append(c)
        n = len(pool)
        share = {f: k * len(cs) // n for f, cs in fams.items()} if n else {}
        rest = k - sum(share.values())
        order = sorted(fams, key=lambda f: (-(k * len(fams[f]) % n), list(fams).index(f)))
        for f in order[:rest]:
            share[f] += 1
        chosen: list[dict[str, Any]] = []
        for f, cs in fams.items():
            chosen += random.Random(f"jsonl-draw/{self.seed}/{split}/{f}").sample(cs, share[f])
        return sorted(chosen, key=lambda c: c["line"]), {f: [share[f], len(cs)] for f, cs in fams.items()}

    def _pinned(self, counts: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
        """The cases the profile's `case_ids` file names, split by split, in its order: exactly as many as
        the profile takes (a pinned id left unused would be set and ignored), each the file's own id, in
        the split the file gives it (where it gives one), none twice."""
        where = f"case_ids {self.pinned}"
        try:
            data = self.pinned.read_bytes()
            pins = json.loads(data.decode("utf-8-sig"))
        except OSError as e:
            raise TaskFileError(f"{where} is unreadable: {e}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TaskFileError(f"{where} is not JSON ({e}): write {{\"train\": [ids], \"dev\": [ids], "
                                "\"test\": [ids]}") from None
        self._pins_sha256 = hashlib.sha256(data).hexdigest()
        if not isinstance(pins, dict) or set(pins) - set(SPLITS):
            raise TaskFileError(f"{where} must be one object {{\"train\": [ids], \"dev\": [ids], \"test\": [ids]}}"
                                + (f"; it has {', '.join(sorted(map(str, set(pins) - set(SPLITS))))}"
                                   if isinstance(pins, dict) else ""))
        by_id = {_id_key(c["id"]): c for c in self.rows if c["id"] is not None}
        found, seen, plan = [], {}, {}
        for s in SPLITS:
            ids = pins.get(s, [])
            if not isinstance(ids, list):
                raise TaskFileError(f"{where}: \"{s}\" must be a list of the task file's ids")
            if len(ids) != counts[s]:
                found.append(f"{s} pins {len(ids)} case(s) and the profile takes {counts[s]} "
                             f"({'tasks' if s == 'train' else s} = {counts[s]}): pin exactly as many")
            plan[s] = []
            for v in ids:
                key = _id_key(v)
                c = by_id.get(key)
                if not (type(v) is int or (isinstance(v, str) and v)):
                    found.append(f"{s}: {key} is not an id (a case's id is a non-empty string or an integer)")
                elif key in seen:
                    found.append(f"{s}: the id {key} is pinned already ({seen[key]})")
                elif c is None:
                    found.append(f"{s}: the id {key} is no case's id in task file {self.path.name}"
                                 + (" (ids are matched with their type: 5 and \"5\" are two ids)"
                                    if _id_key(str(v) if not isinstance(v, str) else _int_or(v)) in by_id else ""))
                elif c["split"] is not None and c["split"] != s:
                    found.append(f"{s}: the id {key} is a {c['split']} case of the task file (line {c['line']})")
                else:
                    plan[s].append(c)
                seen.setdefault(key, s)
        if found:
            more = len(found) - FINDINGS_SHOWN
            raise TaskFileError(f"{where}: {len(found)} problem(s)" + (f" (the first {FINDINGS_SHOWN}, {more} more)"
                                                                      if more > 0 else "") + ":\n"
                                + "\n".join(f"  {f}" for f in found[:FINDINGS_SHOWN]))
        return plan

    def cases(self, counts: dict[str, int]) -> list[dict[str, Any]]:
        plan = self.plan(counts)
        self.used = {s: len(plan[s]) for s in SPLITS}
        rows = []
        for s in SPLITS:
            for i, c in enumerate(plan[s]):
                row = {"case_id": f"{s}-{i:05d}", "split": s,
                       "task_id": canonical_sha256({"prompt": c["prompt"], "answer": c["answer"],
                                                    "schema": c["schema"]}),
                       "family": c["family"], "variant": 0, "heldout_variant": False,
                       "prompt": c["prompt"], "answer": c["answer"], "schema": c["schema"],
                       "target": c["target"], "records": [],
                       "question": {"file": self.path.name, "line": c["line"], "id": c["id"]}}
                if "wrong_answer" in c:
                    row["wrong_answer"] = c["wrong_answer"]
                rows.append(row)
        return rows

    def damage(self, rows: list[dict[str, Any]], n: int, seed: int, *, required: bool) -> dict[int, Any]:
        """The file's own wrong answers, for `n` training cases drawn among those that have one (where
        no arm trains on them, as many as there are, up to `n`). Taken out of the rows: the committed
        cases hold a wrong answer only where the damaged control trains on it."""
        have = [i for i, r in enumerate(rows) if r["split"] == "train" and "wrong_answer" in r]
        if not required:
            n = min(n, len(have))
        if len(have) < n:
            raise TaskFileError(
                f"task file {self.path}: the damaged-target control trains on wrong answers for {n} training "
                f"cases, and {len(have)} of the training cases have a \"wrong_answer\": add \"wrong_answer\" "
                "to more cases, or remove the damaged arm (data = \"damaged\") from the experiment")
        rng = random.Random(f"damage/{seed}")
        chosen = sorted(rng.sample(have, n))
        wrong = {i: rows[i]["wrong_answer"] for i in chosen}
        for r in rows:
            r.pop("wrong_answer", None)
        return wrong
