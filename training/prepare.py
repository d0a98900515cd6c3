"""`prepare`: generate, check, tokenize and commit every input of an experiment, once.

Outputs (under the trial home H):
    inputs/tasks.jsonl          every task case (train/dev/test) with prompt, answer, schema, target
                                (from the experiment's task source: `training.sources`)
                                and, for damaged training tasks, the damaged answer
    inputs/replay.jsonl         the replay conversations trained on
    inputs/probes.jsonl         the retention probes (response loss, paired against the seed)
    inputs/train.safetensors    clean training corpus (tasks first, then replay)
    inputs/train-damaged.safetensors   the same documents with the damaged targets
    inputs/probes.safetensors   tokenized probes
    inputs/documents.jsonl      one row per training document (source, weight, token counts)
    inputs/schedule.json        the fixed global document order, one list per update
    prepared.json               identities, role hashes, counts, corruption identities, model
                                receipt, previous-experiment proof and the sha256 of every input
    prepare-record.json         wall time by phase (not part of the commitment)
then appends a `prepare` entry for prepared.json to H/commitments.jsonl.

Everything is built in a hidden temporary directory and moved into place at the end, so a failure
leaves H as it was. Re-running with identical inputs is a no-op; different inputs are refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from evidence.canonical import canonical_sha256, file_sha256, read_json, read_jsonl, write_json_atomic
from evidence.commitments import CommitmentError, CommitmentLog
from evidence.errors import UserError
from evidence.inputs import changed_input, load_cases  # noqa: F401 — load_cases: host stages import it here
from training import corpus as corpus_mod
from training import replay as replay_mod
from training.config import Resolved
from training.hold import NEW_HOME
from training.seed import load_tokenizer, seed_parameters, verify_seed
from training.sources import Finding, Generated, JsonlFile, TaskFileError, TaskSource, prompt_hash, target_text

FORMAT = "trial-prepared-v1"
PREPARED = "prepared.json"


class PrepareError(UserError, RuntimeError):
    """Prepare cannot proceed; the message names the thing and the fix."""


def task_source(cfg: Resolved, measure: CaseLengths | None = None, *, legacy: bool = False) -> TaskSource:
    """The experiment's cases: its task_file's, else the generated families'. With `measure`, every
    case of the file is measured against the profile's max_context in the same pass as its lines;
    `legacy`: drawn by the rule of a home prepared before rules were recorded (`drawn_before`)."""
    exp, prof = cfg.experiment, cfg.profile
    if exp.task_file is not None:
        try:
            return JsonlFile(exp.task_path(), exp.generator_seed, measure=measure, pinned=cfg.case_ids_path(),
                             legacy=legacy)
        except TaskFileError as e:
            raise PrepareError(str(e)) from None
    return Generated(exp.generator_seed, tuple(prof.records), exp.heldout_test_fraction)


def said(source: TaskSource, w: Finding) -> str:
    """A source's warning as one line naming where it is."""
    return f"task file {getattr(source, 'path', '(generated)')}: {w.what}"


class CaseLengths:
    """Findings for the cases that do not fit the profile's context as a document — the prompt through
    the chat template, the answer (and the wrong answer the damaged control may train on) and the end
    token: what training refuses and what scoring would otherwise meet only after every arm trained
    (a 5 MB test prompt asked one decoder for terabytes of attention). Every case is measured, used
    at this profile or not, as every line is checked. `longest`: the longest document seen."""

    def __init__(self, tok: Any, cfg: Resolved):
        self.tok, self.limit, self.profile = tok, cfg.profile.max_context, cfg.profile_name
        self.longest = 0

    def __call__(self, cases: list[dict[str, Any]]) -> list[Finding]:
        targets = [[c["target"]] + ([target_text(c["wrong_answer"], c["schema"])] if "wrong_answer" in c else [])
                   for c in cases]
        convs = [[{"role": "user", "content": c["prompt"]}, {"role": "assistant", "content": t}]
                 for c, ts in zip(cases, targets) for t in ts]
        lengths = iter(corpus_mod.token_lengths(self.tok, convs))
        found = []
        for c, ts in zip(cases, targets):
            n = max(next(lengths) for _ in ts)
            self.longest = max(self.longest, n)
            if n > self.limit:
                found.append(Finding(c.get("line"), ("" if "case_id" not in c else f"case {c['case_id']}: ")
                                     + f"{n:,} tokens as a document (chat template, answer, end token), over "
                                     f"max_context {self.limit}: shorten it, or raise max_context in profile "
                                     f"{self.profile}"))
        return found


def drawn_before(home: Path) -> bool:
    """Whether `home` was prepared from a task file before the draw's rule was recorded with it: its
    prepared.json's task_source has no `draw`. Such a home keeps the rule it was prepared by, so that a
    later run of it prepares the same cases (and is not refused as another study)."""
    try:
        ts = read_json(home / PREPARED).get("task_source")
    except (OSError, ValueError):
        return False
    return isinstance(ts, dict) and "draw" not in ts


def task_rows(cfg: Resolved, tok: Any = None, *, measured: CaseLengths | None = None, legacy: bool = False
              ) -> tuple[TaskSource, list[dict[str, Any]], list[int]]:
    """(the source, every case as `inputs/tasks.jsonl` holds it, the indices of the damaged ones): the
    damaged-target control's share of the training cases carry a wrong answer and its target. With the
    tokenizer, every case is measured against max_context (the generated ones too, by case id), so
    nothing `prepare` commits can fail to fit when it is trained or scored. What `validate` and
    `prepare` both call: they refuse the same inputs with the same words."""
    exp, prof = cfg.experiment, cfg.profile
    measure = measured or (CaseLengths(tok, cfg) if tok is not None else None)
    source = task_source(cfg, measure, legacy=legacy)
    try:
        rows = source.cases(cfg.split_counts)
        wrong = source.damage(rows, round(exp.damaged_fraction * prof.tasks), exp.generator_seed,
                              required=any(a.data == "damaged" for a in exp.arms))
    except TaskFileError as e:
        raise PrepareError(str(e)) from None
    for i in sorted(wrong):
        rows[i]["damaged_answer"] = wrong[i]
        rows[i]["damaged_target"] = target_text(wrong[i], rows[i]["schema"])
    if measure is not None and exp.task_file is None:  # the file's cases were measured as it was read
        long = measure([{"case_id": r["case_id"], "prompt": r["prompt"], "target": r["target"],
                                         "schema": r["schema"],
                                         **({"wrong_answer": r["damaged_answer"]} if "damaged_answer" in r else {})}
                                        for r in rows])
        if long:
            raise PrepareError(f"{len(long)} generated case(s) do not fit profile {cfg.profile_name}'s context (or "
                               f"lower its 'records'); the first: {long[0].what}")
    return source, rows, sorted(wrong)


def _previous_proof(previous_home: Path, tasks: list[dict[str, Any]],
                    expected: str | None) -> dict[str, Any]:
    log = CommitmentLog(previous_home)
    try:
        entry = log.require("prepare", PREPARED)
    except CommitmentError as e:
        raise PrepareError(f"--previous-home {previous_home}: {e}") from None
    prev = read_json(previous_home / PREPARED)
    prev_name = prev["experiment"]["experiment"]["name"]
    if expected and prev_name != expected:
        raise PrepareError(f"--previous-home {previous_home} holds {prev_name}, but this experiment "
                           f"must be disjoint from {expected}")
    tasks_file = previous_home / "inputs" / "tasks.jsonl"
    want = prev["inputs"]["tasks.jsonl"]
    if not tasks_file.is_file() or file_sha256(tasks_file) != want:
        raise PrepareError(f"--previous-home {previous_home}: inputs/tasks.jsonl is missing or "
                           "differs from its committed hash")
    prev_rows = read_jsonl(tasks_file)
    prev_ids, prev_prompts = {r["task_id"] for r in prev_rows}, {prompt_hash(r["prompt"]) for r in prev_rows}
    ids, prompts = {t["task_id"] for t in tasks}, {prompt_hash(t["prompt"]) for t in tasks}
    if why := recurring(prev_rows, tasks):
        raise PrepareError(f"--previous-home {previous_home} ({prev_name}) {why}")
    return {
        "experiment": prev["experiment"]["experiment"]["name"],
        "prepared_sha256": entry["sha256"],
        "commitment_hash": entry["hash"],
        "previous_task_identities": len(prev_ids),
        "previous_prompts": len(prev_prompts),
        "compared_task_identities": len(ids),
        "compared_prompts": len(prompts),
        "overlapping_identities": 0,
        "overlapping_prompts": 0,
    }


def recurring(earlier: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str | None:
    """Why `rows` may not follow an experiment of `earlier` cases (a task identity or a prompt recurs),
    or None: what prepare refuses against the previous home, and validate against its cases."""
    ids = {r["task_id"] for r in rows} & {r["task_id"] for r in earlier}
    prompts = {prompt_hash(r["prompt"]) for r in rows} & {prompt_hash(r["prompt"]) for r in earlier}
    if not ids and not prompts:
        return None
    return (f"overlaps this experiment: {len(ids)} task identities and {len(prompts)} prompts recur (e.g. task "
            f"{sorted(ids or {'-'})[0][:16]}); use a different generator_seed or previous home")


def _fit(tok: Any, pool: list[dict[str, Any]], max_context: int) -> tuple[list[dict[str, Any]], int]:
    lengths = corpus_mod.token_lengths(tok, [c["messages"] for c in pool]) if pool else []
    kept = [c for c, n in zip(pool, lengths) if n <= max_context]
    return kept, len(pool) - len(kept)


def build_inputs(cfg: Resolved, model_dir: Path, out: Path, *, replay_file: Path | None,
                 previous_home: Path | None, timer: dict[str, float],
                 warnings: list[str] | None = None, legacy: bool = False) -> dict[str, Any]:
    """prepared.json's content, every input written under `out`; what is used as written but should be
    seen (`TaskSource.warnings`) appended to `warnings`."""
    exp, prof = cfg.experiment, cfg.profile
    t0 = time.monotonic()
    receipt = verify_seed(model_dir)
    kind = receipt["meta"].get("kind")
    if prof.seed != "local" and kind != prof.seed:
        raise PrepareError(f"profile {cfg.profile_name} uses the '{prof.seed}' seed but {model_dir} "
                           f"holds a '{kind}' seed; pass --model-dir of a '{prof.seed}' seed")
    tok = load_tokenizer(model_dir, verified=True)
    timer["seed_verify_and_tokenizer"] = time.monotonic() - t0

    t0 = time.monotonic()
    source, rows, damaged_idx = task_rows(cfg, tok, legacy=legacy)
    if warnings is not None:
        warnings += [said(source, w) for w in source.warnings]
    timer["generate_tasks"] = time.monotonic() - t0

    t0 = time.monotonic()
    proof = _previous_proof(previous_home, rows, exp.previous) if previous_home else None
    timer["previous_proof"] = time.monotonic() - t0

    t0 = time.monotonic()
    need = prof.replay + prof.probes
    if replay_file:
        pool = replay_mod.load_jsonl(replay_file)
        replay_source = {"kind": "user-jsonl", "file": replay_file.name, "sha256": file_sha256(replay_file),
                         "rows": len(pool)}
        random.Random(f"replay-order/{exp.generator_seed}").shuffle(pool)
    else:
        pool = replay_mod.generated_pool(exp.generator_seed, 2 * need + 8,
                                         tuple(prof.replay_steps), "pool",
                                         tuple(prof.replay_parts))
        replay_source = {"kind": "generated", "generator": "training.replay", "seed": exp.generator_seed,
                         "steps": list(prof.replay_steps), "parts": list(prof.replay_parts)}
    pool, too_long = _fit(tok, pool, prof.max_context)
    if len(pool) < need:
        raise PrepareError(
            f"replay source has {len(pool)} usable conversations (≤ {prof.max_context} tokens; "
            f"{too_long} longer ones skipped) but {prof.replay} replay + {prof.probes} probes are needed"
        )
    replay, probes = pool[:prof.replay], pool[prof.replay:need]
    replay_source["skipped_too_long"] = too_long
    timer["replay"] = time.monotonic() - t0

    t0 = time.monotonic()
    train = rows[:prof.tasks]
    task_convs = [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["target"]}]
                  for r in train]
    damaged_convs = [
        [{"role": "user", "content": r["prompt"]},
         {"role": "assistant", "content": r.get("damaged_target", r["target"])}]
        for r in train
    ]
    replay_convs = [c["messages"] for c in replay]
    w = [exp.weights.task] * len(train) + [exp.weights.replay] * len(replay)
    clean = corpus_mod.build(tok, task_convs + replay_convs, w)
    damaged = corpus_mod.build(tok, damaged_convs + replay_convs, w)
    probe_corpus = corpus_mod.build(tok, [c["messages"] for c in probes], [1] * len(probes))
    plan = corpus_mod.schedule(len(clean), prof.updates, cfg.global_batch, exp.generator_seed)
    timer["tokenize"] = time.monotonic() - t0

    t0 = time.monotonic()
    inputs = out / "inputs"
    inputs.mkdir(parents=True)
    with open(inputs / "tasks.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
    for name, items in (("replay.jsonl", replay), ("probes.jsonl", probes)):
        with open(inputs / name, "w", encoding="utf-8") as f:
            for c in items:
                f.write(json.dumps(c, ensure_ascii=False, sort_keys=True) + "\n")
    clean.save(inputs / "train.safetensors")
    damaged.save(inputs / "train-damaged.safetensors")
    probe_corpus.save(inputs / "probes.safetensors")
    damaged_set = set(damaged_idx)
    with open(inputs / "documents.jsonl", "w", encoding="utf-8") as f:
        for i in range(len(clean)):
            is_task = i < len(train)
            f.write(json.dumps({
                "index": i, "role": "task" if is_task else "replay",
                "source": rows[i]["task_id"] if is_task else replay[i - len(train)]["id"],
                "case_id": rows[i]["case_id"] if is_task else None,
                "weight": int(clean.weights[i]), "prompt_tokens": int(clean.prompt_lens[i]),
                "targets": int(clean.targets[i]), "damaged": i in damaged_set,
                "damaged_targets": int(damaged.targets[i]),
            }, sort_keys=True) + "\n")
    write_json_atomic(inputs / "schedule.json", {"global_batch": cfg.global_batch, "updates": plan})
    timer["write"] = time.monotonic() - t0

    def role_counts(c: corpus_mod.Corpus, lo: int, hi: int) -> dict[str, int]:
        return {"documents": hi - lo, "target_tokens": int(c.targets[lo:hi].sum()),
                "weighted_targets": int(c.weighted_targets[lo:hi].sum()),
                "prompt_tokens": int(c.prompt_lens[lo:hi].sum()),
                "max_document_tokens": int(c.lengths[lo:hi].max()) if hi > lo else 0}

    n = len(train)
    task_c, replay_c = role_counts(clean, 0, n), role_counts(clean, n, len(clean))
    total_t = task_c["target_tokens"] + replay_c["target_tokens"]
    total_w = task_c["weighted_targets"] + replay_c["weighted_targets"]
    variants = Counter((r["split"], r["variant"]) for r in rows)
    families = Counter((r["split"], r["family"]) for r in rows)
    prepared = {
        "format": FORMAT,
        "experiment": cfg.as_dict(),
        "experiment_digest": cfg.digest(),
        "model": {"receipt_digest": receipt["digest"], "kind": receipt["meta"].get("kind"),
                  "weights_sha256": receipt["files"].get("model.safetensors", {}).get("sha256"),
                  "parameters": seed_parameters(receipt)},
        "inputs": {p.name: file_sha256(p) for p in sorted(inputs.iterdir())},
        "role_hashes": {
            "train_tasks": canonical_sha256([r["task_id"] for r in rows[:n]]),
            "dev_tasks": canonical_sha256([r["task_id"] for r in rows if r["split"] == "dev"]),
            "test_tasks": canonical_sha256([r["task_id"] for r in rows if r["split"] == "test"]),
            "train_prompts": canonical_sha256([prompt_hash(r["prompt"]) for r in rows[:n]]),
            "test_prompts": canonical_sha256(
                [prompt_hash(r["prompt"]) for r in rows if r["split"] == "test"]),
            "replay": canonical_sha256([c["id"] for c in replay]),
            "probes": canonical_sha256([c["id"] for c in probes]),
        },
        "splits": {s: sum(1 for r in rows if r["split"] == s) for s in ("train", "dev", "test")},
        "test_heldout_variant_cases": sum(1 for r in rows if r["split"] == "test" and r["heldout_variant"]),
        "variants": {f"{s}/{v}": c for (s, v), c in sorted(variants.items())},
        "families": {f"{s}/{fam}": c for (s, fam), c in sorted(families.items())},
        "generator_collisions_skipped": source.collisions,
        "replay_source": replay_source,
        "counts": {
            "task": task_c, "replay": replay_c,
            "probes": role_counts(probe_corpus, 0, len(probe_corpus)),
            "damaged_task": role_counts(damaged, 0, n),
            "target_tokens": total_t,
            "weighted_targets": total_w,
            "task_share_of_targets": round(task_c["target_tokens"] / total_t, 6),
            "task_share_of_weighted_targets": round(task_c["weighted_targets"] / total_w, 6),
            "task_share_of_documents": round(n / len(clean), 6),
        },
        "corruption": {
            "fraction_configured": exp.damaged_fraction, "count": len(damaged_idx),
            "task_ids": [rows[i]["task_id"] for i in damaged_idx],
            "case_ids": [rows[i]["case_id"] for i in damaged_idx],
        },
        "schedule": {
            "updates": prof.updates, "global_batch": cfg.global_batch, "epochs": cfg.epochs,
            "weighted_targets_per_update": corpus_mod.update_weighted_targets(clean, plan),
            "weighted_targets_per_update_damaged": corpus_mod.update_weighted_targets(damaged, plan),
        },
        "previous": proof,
    }
    if (described := source.describe()) is not None:  # the generated families' homes keep their form
        prepared["task_source"] = described
    return prepared


def prepare(cfg: Resolved, home: str | os.PathLike[str], model_dir: str | os.PathLike[str], *,
            replay_file: str | None = None, previous_home: str | None = None) -> dict[str, Any]:
    """Build, move into place and commit; returns {prepared, record, status, warnings}."""
    home, model_dir = Path(home), Path(model_dir)
    if replay_file is not None and not Path(replay_file).is_file():
        raise PrepareError(f"replay file {replay_file} does not exist")
    if previous_home is not None:
        ph = Path(previous_home)
        if not (ph / PREPARED).is_file():
            raise PrepareError(f"--previous-home {ph} has no {PREPARED}; prepare that experiment first")
        if ph.resolve() == home.resolve():
            raise PrepareError("--previous-home must be another experiment's home, not this one")
    if cfg.experiment.previous and previous_home is None:
        raise PrepareError(
            f"{cfg.experiment.name} must not repeat any task of {cfg.experiment.previous}: pass "
            f"--previous-home with the home where {cfg.experiment.previous} was prepared "
            "(`orchestrate run` does this for you)")
    made = not home.exists()
    home.mkdir(parents=True, exist_ok=True)
    try:
        with _locked(home):
            return _prepare_locked(cfg, home, model_dir, replay_file, previous_home)
    except BaseException:
        if made:
            _unmake(home)
        raise


def _unmake(home: Path) -> None:
    """A home this prepare made, taken away again when it fails: a refused run leaves nothing behind.
    Only while empty (its `.prepare-*` folder is already gone): a home that holds anything stays."""
    with contextlib.suppress(OSError):
        home.rmdir()


def prepare_chain(chain: Iterable[Resolved], home_of: Callable[[Resolved], str | os.PathLike[str]],
                  model_dir: str | os.PathLike[str], *, replay_file: str | None = None
                  ) -> Iterator[tuple[Resolved, Path, dict[str, Any]]]:
    """Prepare an experiment's lineage (`config.lineage`: the earliest first), each against the home
    of the one before it, so none of an earlier experiment's tasks recurs; yields (config, home,
    result) as each is committed, the lineage's last home last. `replay_file` (the user's replay
    conversations) is the last experiment's, the one trained: the earlier ones are prepared only so
    that their tasks are known."""
    previous: Path | None = None
    chain = list(chain)
    for i, cfg in enumerate(chain):
        home = Path(home_of(cfg))
        res = prepare(cfg, home, model_dir, previous_home=str(previous) if previous else None,
                      replay_file=replay_file if i == len(chain) - 1 else None)
        yield cfg, home, res
        previous = home


def _replay_said(source: dict[str, Any]) -> str:
    if source.get("kind") == "user-jsonl":
        return f"the file {source.get('file')} (sha256 {str(source.get('sha256'))[:12]}…)"
    return "generated" if source.get("kind") == "generated" else "unknown"


@contextlib.contextmanager
def _locked(home: Path):
    """An exclusive flock on the home directory itself: concurrent prepares queue, no lock file."""
    fd = os.open(home, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _prepare_locked(cfg: Resolved, home: Path, model_dir: Path, replay_file: str | None,
                    previous_home: str | None) -> dict[str, Any]:
    log = CommitmentLog(home)
    log.entries()  # a broken log stops us before any work
    if log.latest("prepare") is not None and not (home / PREPARED).exists():
        raise PrepareError(f"{home} has a 'prepare' commitment but no {PREPARED}; the home is "
                           f"inconsistent — restore prepared.json from your evidence or {NEW_HOME}")
    started = time.monotonic()
    timer: dict[str, float] = {}
    tmp = Path(tempfile.mkdtemp(dir=home, prefix=".prepare-"))
    warnings: list[str] = []
    try:
        prepared = build_inputs(cfg, model_dir, tmp, replay_file=Path(replay_file) if replay_file else None,
                                previous_home=Path(previous_home) if previous_home else None,
                                timer=timer, warnings=warnings, legacy=drawn_before(home))
        digest = canonical_sha256(prepared)
        existing = home / PREPARED
        if existing.exists():
            old = read_json(existing)
            if canonical_sha256(old) != digest:
                was, now = old.get("replay_source") or {}, prepared.get("replay_source") or {}
                hint = ("" if was == now else f"; its replay was {_replay_said(was)}, this run's is "
                        f"{_replay_said(now)} (every run of a home must give the same `--replay`, or none)")
                was, now = old.get("task_source") or {}, prepared.get("task_source") or {}
                if was.get("sha256") != now.get("sha256"):
                    hint += (f"; its task file was {was.get('file')} (sha256 {str(was.get('sha256'))[:12]}…), this "
                             f"run's is {now.get('file')} (sha256 {str(now.get('sha256'))[:12]}…): a changed task "
                             "file is another study")
                raise PrepareError(
                    f"{existing} already holds different prepared inputs (experiment "
                    f"{old['experiment']['experiment']['name']}/{old['experiment']['profile_name']}{hint}); "
                    f"inputs are committed once per home — {NEW_HOME}"
                )
            status = "unchanged"
        else:
            if (home / "inputs").exists():  # leftover of an interrupted run: keep it, aside
                os.replace(home / "inputs", home / f".orphaned-inputs-{time.time_ns()}")
            os.replace(tmp / "inputs", home / "inputs")
            write_json_atomic(existing, prepared)
            status = "prepared"
        if log.latest("prepare") is None:
            log.append("prepare", PREPARED, {"prepared_digest": digest,
                                             "experiment": cfg.experiment.name,
                                             "profile": cfg.profile_name})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    timer["total"] = time.monotonic() - started
    record = {"status": status, "experiment": cfg.experiment.name, "profile": cfg.profile_name,
              "seconds": {k: round(v, 3) for k, v in timer.items()}}
    if status == "prepared":  # a later run that finds the inputs unchanged keeps the original record
        write_json_atomic(home / "prepare-record.json", record)
    return {"prepared": prepared, "record": record, "status": status, "warnings": warnings}


def require_prepared(home: str | os.PathLike[str]) -> dict[str, Any]:
    """prepared.json after checking its commitment and every input file's hash."""
    home = Path(home)
    try:
        CommitmentLog(home).require("prepare", PREPARED)
    except CommitmentError as e:
        raise PrepareError(f"{e} (run `python -m training prepare --home {home} …`)") from None
    prepared = read_json(home / PREPARED)
    bad = changed_input(home, prepared)
    if bad is not None:
        raise PrepareError(f"prepared input {bad} is missing or differs from its committed hash")
    return prepared
