"""`evaluate --role dev|test --arm A`: greedy answers to every case, strictly checked, plus the
retention probes' response loss — each attempt kept, none silently replaced.

    evaluations/<role>/<arm>/attempt-<n>/started.json    written first: a crashed attempt stays visible
    evaluations/<role>/<arm>/attempt-<n>/answers.jsonl   every raw answer with its verdict
    evaluations/<role>/<arm>/attempt-<n>/probes.jsonl    response loss (nats per target token) per probe
    evaluations/<role>/<arm>/attempt-<n>/summary.json
    evaluations/<role>/<arm>/attempt-<n>/receipt.json    then committed as '<role>-evaluation'

Scoring needs a committed selection (dev included: it scores the complete selection, never an
intermediate checkpoint). A second attempt for the same role and arm needs `retry_reason`, which is
recorded. The model is verified against the receipt the selection names (the seed arm: against the
receipt prepare used) before it is loaded.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from evidence.attempts import attempts, next_attempt
from evidence.canonical import read_json, write_json_atomic
from evidence.checker import check_answer
from evidence.commitments import CommitmentLog
from evidence.receipts import make_receipt
from training.errors import TrainError


def attempts_dir(home: Path, role: str, arm: str) -> Path:
    return home / "evaluations" / role / arm


def model_dir_for(home: Path, arm: str, selection: dict[str, Any], seed_dir: Path | None,
               prepared: dict[str, Any]) -> tuple[Path, str]:
    from training.seed import verify_seed

    if arm == selection["baseline"]:
        if seed_dir is None:
            raise TrainError(f"evaluating the seed arm '{arm}' needs --model-dir (the seed prepare used)")
        receipt = verify_seed(seed_dir)
        if receipt["digest"] != prepared["model"]["receipt_digest"]:
            raise TrainError(f"{seed_dir} is not the seed these inputs were prepared with")
        return seed_dir, receipt["digest"]
    if arm not in selection["candidates"]:
        raise TrainError(f"arm '{arm}' is not in the committed selection "
                         f"({', '.join([selection['baseline'], *selection['candidates']])})")
    d = home / "runs" / arm / "model"
    receipt = verify_seed(d)  # same layout as a seed: every file re-hashed against receipt.json
    if receipt["digest"] != selection["candidates"][arm]:
        raise TrainError(f"{d} has receipt {receipt['digest']}, the selection names "
                         f"{selection['candidates'][arm]}")
    return d, receipt["digest"]


def prompt_text(tok: Any, case: dict[str, Any]) -> str:
    """The case's prompt as the model sees it: one user turn and the generation prompt."""
    return tok.apply_chat_template([{"role": "user", "content": case["prompt"]}], tokenize=False,
                                   add_generation_prompt=True)


def generation_budget(tok: Any, cases: Any) -> int:
    """max_new_tokens: twice the longest reference answer of these cases, plus 8 — room for a wrong
    answer to be wrong at length without letting a runaway answer run forever."""
    return 2 * max(len(tok(json.dumps(c["answer"]), add_special_tokens=False)["input_ids"])
                   for c in cases) + 8


def evaluate(home: str | os.PathLike[str], arm: str, role: str, *, seed_dir: Path | None = None,
             retry_reason: str | None = None, batch: int = 16,
             say=lambda m: None) -> dict[str, Any]:
    import torch

    from training.corpus import Corpus
    from training.objective import WeightedResponseLoss, collate
    from training.prepare import load_cases, require_prepared
    from training.seed import load_tokenizer, quiet_libraries

    home = Path(home)
    if role not in ("dev", "test"):
        raise TrainError("--role is dev or test")
    prepared = require_prepared(home)
    log = CommitmentLog(home)
    log.require("selection", "selection.json")  # raises, naming the missing stage
    selection = read_json(home / "selection.json")
    model_dir, receipt_digest = model_dir_for(home, arm, selection, seed_dir, prepared)
    from training.runtime import device_lock, pick_device

    wants_cuda = prepared["experiment"]["profile"]["device"] == "cuda" and torch.cuda.is_available()
    device = pick_device("cuda" if wants_cuda else "cpu", int(os.environ.get("LOCAL_RANK", "0")))
    lock = device_lock(device)  # noqa: F841 — before any attempt starts or model is allocated

    root = attempts_dir(home, role, arm)
    earlier = attempts(root)
    if earlier and not retry_reason:
        raise TrainError(f"{role} evaluation of {arm} already has {len(earlier)} attempt(s) under {root}; "
                         "every attempt is kept — pass --retry REASON to run another (recorded)")
    n = next_attempt(root)
    out = root / f"attempt-{n}"
    out.mkdir(parents=True)
    write_json_atomic(out / "started.json", {"arm": arm, "role": role, "attempt": n, "at": time.time(),
                                             "model_receipt": receipt_digest, "retry_reason": retry_reason})
    t0 = time.perf_counter()
    quiet_libraries()
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    tok = load_tokenizer(model_dir, verified=True)
    model.to(device)
    cases = [c for c in load_cases(home).values() if c["split"] == role]
    max_new = generation_budget(tok, cases)
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = []
    for i in range(0, len(cases), batch):
        chunk = cases[i:i + batch]
        texts = [prompt_text(tok, c) for c in chunk]
        enc = tok(texts, add_special_tokens=False, return_tensors="pt", padding=True).to(device)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=pad)
        for c, seq in zip(chunk, gen[:, enc["input_ids"].shape[1]:]):
            text = tok.decode(seq, skip_special_tokens=True).strip()
            v = check_answer(text, c["schema"], c["answer"])
            rows.append({"case_id": c["case_id"], "family": c["family"],
                         "heldout_variant": c["heldout_variant"], "text": text, **v.as_dict()})
        say(f"{role} {arm}: {min(i + batch, len(cases))}/{len(cases)} answered")
    with open(out / "answers.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")

    probes = Corpus.load(home / "inputs" / "probes.safetensors")
    probes.weights[:] = 1
    loss_fn = WeightedResponseLoss(model)
    probe_rows = []
    with torch.no_grad():
        for d in range(len(probes)):
            mb = collate(probes, [d], pad_id=pad).to(device)
            s = float(loss_fn(*mb.args()))
            probe_rows.append({"probe": d, "targets": mb.weighted_targets, "loss": s / mb.weighted_targets})
    with open(out / "probes.jsonl", "w", encoding="utf-8") as f:
        for r in probe_rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    correct = sum(r["correct"] for r in rows)
    summary = {"arm": arm, "role": role, "attempt": n, "model_receipt": receipt_digest,
               "cases": len(rows), "correct": correct, "accuracy": correct / max(1, len(rows)),
               "probe_mean_loss": sum(r["loss"] for r in probe_rows) / max(1, len(probe_rows)),
               "max_new_tokens": max_new, "seconds": time.perf_counter() - t0,
               "retry_reason": retry_reason}
    write_json_atomic(out / "summary.json", summary)
    receipt = make_receipt(out, meta={"arm": arm, "role": role, "attempt": n}, exclude=["started.json"])
    write_json_atomic(out / "receipt.json", receipt)
    log.append(f"{role}-evaluation", str((out / "receipt.json").relative_to(home)),
               {"arm": arm, "attempt": n, "receipt_digest": receipt["digest"],
                "retry_reason": retry_reason})
    return summary
