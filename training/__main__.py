"""`python -m training`: seed, prepare, train, check (the host-side stages)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from evidence.checker import check_answer
from evidence.errors import USER_ERROR_EXIT, UserError
from evidence.inputs import id_text, user_id
from training.config import ConfigError, Resolved, resolve
from training.results import finished, load_results, summarize
from training.seed import materialize, seed_parameters
from training.select import select

# start-up: training.prepare, and train and evaluate through it, load numpy (~0.15 s), training.serve FastAPI
# (~0.4 s): they are imported in the commands that use them ("start-up" below), not by --help or seed.

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Host-side stages of a training trial.")
# no markup: an error's text is printed as it is (brackets in paths and patterns included)
err = Console(stderr=True, markup=False, soft_wrap=True)  # and no wrapping: a path stays whole in a log
out = Console(markup=False)


def _fail(e: Exception) -> None:
    err.print(Text.assemble(("error:", "bold red"), f" {e}"), highlight=False)
    raise typer.Exit(getattr(e, "exit_code", USER_ERROR_EXIT))


@app.command()
def seed(kind: str = typer.Option(..., help="smollm2-135m | tiny | local"),
         out_dir: Path = typer.Option(..., "--out", help="directory to create"),
         source: Optional[Path] = typer.Option(None, help="for --kind local: a Hugging Face dir"),
         expect: Optional[str] = typer.Option(None, help="required receipt digest")) -> None:
    """Materialize a seed model directory (safetensors + tokenizer + receipt.json), offline."""
    try:
        with err.status(f"materializing {kind} seed into {out_dir}…"):
            receipt = materialize(kind, out_dir, source=str(source) if source else None,
                                  expect=expect, say=lambda m: err.print(m, highlight=False))
    except UserError as e:
        _fail(e)
    out.print_json(json.dumps({"out": str(out_dir), "kind": kind, "receipt_digest": receipt["digest"],
                               "parameters": seed_parameters(receipt),
                               "seconds": receipt["meta"].get("seconds")}))


@app.command()
def prepare(experiment: str = typer.Option(...), profile: str = typer.Option(...),
            home: Path = typer.Option(..., help="the trial home to write"),
            model_dir: Optional[Path] = typer.Option(
                None, help="seed directory (default: .seeds/<profile's seed kind>)"),
            previous_home: Optional[Path] = typer.Option(
                None, help="home of the previous experiment whose tasks must not recur"),
            replay: Optional[Path] = typer.Option(
                None, help="user-supplied replay JSONL (default: generated conversations)")) -> None:
    """Generate, check, tokenize and commit the experiment's inputs."""
    from training.prepare import prepare as run_prepare  # start-up

    try:
        cfg = resolve(experiment, profile)
        md = model_dir or Path(".seeds") / cfg.profile.seed
        with err.status(f"preparing {experiment}/{profile} in {home}…"):
            res = run_prepare(cfg, home, md, replay_file=str(replay) if replay else None,
                              previous_home=str(previous_home) if previous_home else None)
    except UserError as e:
        _fail(e)
    p, rec = res["prepared"], res["record"]
    c = p["counts"]
    t = Table(title=f"{experiment}/{profile}: {res['status']} in {rec['seconds']['total']:.1f} s")
    for col in ("role", "documents", "target tokens", "weighted targets", "max doc tokens"):
        t.add_column(col, justify="right")
    for role in ("task", "replay", "damaged_task", "probes"):
        r = c[role]
        t.add_row(role, str(r["documents"]), str(r["target_tokens"]), str(r["weighted_targets"]),
                  str(r["max_document_tokens"]))
    err.print(t)
    err.print(f"task share of targets: {c['task_share_of_targets']:.1%} unweighted, "
              f"{c['task_share_of_weighted_targets']:.1%} weighted; "
              f"{p['corruption']['count']} damaged targets; splits {p['splits']}")
    out.print_json(json.dumps({"home": str(home), "status": res["status"],
                               "seconds": rec["seconds"], "counts": c}))


@app.command()
def train(home: Path = typer.Option(..., help="the prepared trial home"),
          arm: str = typer.Option(..., help="arm to train, e.g. clean-pair, diloco-four"),
          model_dir: Optional[Path] = typer.Option(
              None, help="seed directory prepare used (default: .seeds/<profile's seed kind>)"),
          threads: Optional[int] = typer.Option(None, help="torch CPU threads for this rank"),
          resume: bool = typer.Option(False, help="continue from the latest group checkpoint whose "
                                                  "manifest every rank holds")) -> None:
    """Train one rank of ARM (rank identity from WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT)."""
    from training.train import main_say, train as run_train  # start-up

    rank = int(os.environ.get("RANK", "0"))
    try:
        if model_dir is None:
            model_dir = Path(".seeds") / _committed(home).profile.seed
        res = run_train(home, model_dir, arm, threads=threads, say=main_say(rank), resume=resume)
    except UserError as e:
        if _in_group():
            err.print(Text.assemble(("error:", "bold red"), f" {e}"), highlight=False)
            _exit_now(getattr(e, "exit_code", USER_ERROR_EXIT))
        _fail(e)
    t = res["timers"]
    out.print_json(json.dumps({
        "arm": arm, "rank": res["rank"], "updates": len(res["updates"]),
        "final_parameters": res["digests"]["final_parameters"],
        "training_loop_seconds": round(t["training_loop_seconds"], 3),
        "training_payload_bytes_per_update": res["comm"]["training_payload_bytes_per_update"],
        "result": f"{home}/runs/{arm}/rank-{res['rank']}/result.json"}))
    if res["world_size"] > 1:
        _exit_now()


@app.command("select")
def select_cmd(home: Path = typer.Option(..., help="the trial home")) -> None:
    """Verify and commit every candidate's acknowledgments, then commit the selection."""
    try:
        sel = select(home, _committed(home))
    except UserError as e:
        _fail(e)
    out.print_json(json.dumps(sel.model_dump(mode="json")))


@app.command()
def evaluate(home: Path = typer.Option(..., help="the trial home"),
             arm: str = typer.Option(..., help="an arm of the selection, or the seed arm"),
             role: str = typer.Option(..., help="dev | test"),
             model_dir: Optional[Path] = typer.Option(None, help="the seed directory (seed arm only)"),
             retry: Optional[str] = typer.Option(None, help="run another attempt; the reason is recorded")
             ) -> None:
    """Greedy answers to every case of ROLE, strictly checked; retention probe losses."""
    from training.evaluate import evaluate as run_eval  # start-up

    try:
        res = run_eval(home, arm, role, seed_dir=model_dir, retry_reason=retry,
                       say=lambda m: err.print(m, highlight=False))
    except UserError as e:
        _fail(e)
    out.print_json(json.dumps(res.model_dump(mode="json")))


@app.command()
def serve(home: Path = typer.Option(..., help="the trial home (selection committed)"),
          arm: Optional[str] = typer.Option(None, help="default: the selection's serving arm"),
          model_dir: Optional[Path] = typer.Option(None, help="the seed directory (seed arm only)"),
          host: str = typer.Option("127.0.0.1", help="address to listen on (a private one)"),
          port: int = typer.Option(0, help="0 picks a free port (see --ready-file)"),
          ready_file: Optional[Path] = typer.Option(None, help="written with host, port, pid and model "
                                                               "once the port accepts connections"),
          name: str = typer.Option("replica", help="this replica's name in every answer"),
          threads: Optional[int] = typer.Option(None, help="torch CPU threads"),
          cache_size: int = typer.Option(1024, help="retry cache entries (request IDs)")) -> None:
    """Serve the selected model's greedy answers to committed development task IDs over HTTP."""
    # before torch loads: the engine computes a row as if alone on a CPU only with ATen's default kernels
    # (training/engine.py ROW_INVARIANT_CPU_KERNELS); CPU kernels barely matter to a GPU replica
    os.environ["ATEN_CPU_CAPABILITY"] = "default"
    from training.serve import load_replica, serve as run_serve  # start-up

    try:
        with err.status(f"verifying and loading the model for {name}…"):
            rep = load_replica(home, arm=arm, seed_dir=model_dir, name=name, threads=threads,
                               cache_size=cache_size)
    except UserError as e:
        _fail(e)
    err.print(f"{name}: {rep.identity['arm']} (receipt {rep.identity['receipt_digest'][:12]}…), "
              f"{len(rep.tasks)} development tasks, max {rep.max_new_tokens} new tokens, on {rep.device}, "
              f"engine of {rep.engine_facts['slots']} slots"
              + (" (decode and prefills as CUDA graphs)" if rep.engine_facts.get("cuda_graph") else "")
              + (f", decode step compiled in {rep.engine_facts['compile_seconds']:.0f} s"
                 if rep.engine_facts.get("compiled") else ""),
              highlight=False)
    try:
        run_serve(rep, host, port, ready_file)
    except OSError as e:
        _fail(f"cannot listen on {host}:{port}: {e}")


@app.command()
def summary(home: Path = typer.Option(..., help="the trial home"),
            arm: str = typer.Option(..., help="a trained arm")) -> None:
    """Summarize a finished arm from its ranks' result.json files (one JSON object)."""
    try:
        a = _committed(home).arm(arm)
        if not finished(home, arm, a.world_size):
            raise ConfigError(f"arm {arm} has not finished in {home}: every one of its "
                              f"{a.world_size} ranks needs runs/{arm}/rank-<r>/result.json")
    except UserError as e:
        _fail(e)
    out.print_json(json.dumps(summarize(load_results(home, arm, a.world_size)).model_dump(mode="json")))


@app.command()
def check(home: Path = typer.Option(...),
          case: str = typer.Option(..., help="the case: its case id (test-00003), or the id your task file gave it")
          ) -> None:
    """Strictly check the answer text on stdin against CASE; print one JSON line."""
    from training.prepare import load_cases, require_prepared  # start-up

    try:
        require_prepared(home)
        row = _case(load_cases(home), case, home)
    except UserError as e:
        _fail(e)
    verdict = check_answer(sys.stdin.read(), row["schema"], row["answer"])
    uid = user_id(row)  # the task file's id beside the case id, where it gave one (as answers.jsonl has it)
    print(json.dumps({"case": row["case_id"], **({"id": uid} if uid is not None else {}), **verdict.as_dict()}))


def _case(cases: dict[str, dict], name: str, home: Path) -> dict:
    """The case `name` names: a case id (test-00003) first, as the home names its cases; else the id a task
    file gave a case (a non-string id as JSON: `17`). An id that several cases carry (a file prepared
    before ids had to be unique) is refused, naming their case ids."""
    from training.prepare import PrepareError  # start-up

    if name in cases:
        return cases[name]
    found = [c for c in cases.values() if user_id(c) is not None and id_text(user_id(c)) == name]
    if len(found) == 1:
        return found[0]
    where = f"{home}/inputs/tasks.jsonl"
    if found:
        raise PrepareError(f"the id '{name}' is given to {len(found)} cases in {where} "
                           f"({', '.join(c['case_id'] for c in found)}): name one by its case id")
    example = next((c["case_id"] for c in cases.values() if c["split"] == "test"), next(iter(cases), "test-00000"))
    own = next((user_id(c) for c in cases.values() if user_id(c) is not None), None)
    raise PrepareError(f"no case '{name}' in {where}: --case takes a case id (e.g. {example})"
                       + (f" or the id your task file gave a case (e.g. {id_text(own)})" if own is not None else
                          " or the id a task file gave a case (this home's cases have none: e.g. \"q-17\" for a "
                          "line {\"id\": \"q-17\", …})"))


def _committed(home: Path) -> Resolved:
    """The experiment as `prepare` committed it in HOME."""
    from training.prepare import require_prepared  # start-up
    from training.train import resolved_from_prepared

    return resolved_from_prepared(require_prepared(home))


def _in_group() -> bool:
    """Whether this process joined a torch.distributed group (without importing torch to ask)."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _exit_now(code: int = 0) -> None:
    """Leave without interpreter finalization once a distributed rank has said its last word.

    Gloo's worker threads can still hold work objects with Python references when the interpreter
    tears down; destroying them then aborts the process ("terminate called without an active
    exception", seen in CI after a finished rank and after a refused one), so a supervisor would
    read SIGABRT instead of the rank's own exit code. On success result.json and the model are
    fsynced before this point; on a refusal nothing was written that finalization would flush.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
