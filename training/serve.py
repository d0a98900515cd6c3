"""`serve`: one HTTP replica of a selected model, for the serving probe — not a chat service.

It answers only the trial's committed development task IDs (the prompt comes from the committed
inputs, never from the client), greedily. Concurrent requests share decode steps in the batching engine
(training/engine.py: one fixed batch shape, each request prefilled alone), so a task's tokens do not
depend on what else the replica was asked, on arrival order or on load, and every replica of the same
model returns the same tokens. That identity is what the probe and the report check; the engine's
tests check it bit for bit, logits included.

The model is verified before anything listens: its files against the receipt the committed selection
names, and the loaded parameters against the digest the training ranks agreed on; the engine is built
(and on CUDA its decode step captured) before the port opens. A replica that fails any of that exits
without opening its port, saying why.

The retry cache (request ID → answer, bounded, in memory, least recently used evicted) makes a repeated
request ID idempotent so a client may retry safely; a repeat that arrives while the first is still being
generated waits for that answer. It is a benchmark convenience: it does not survive a restart and it is
not billing or exactly-once delivery.

    POST /v1/answer  {"request_id": "...", "task_id": "dev-00003"}
      200 {"request_id", "task_id", "model": {...}, "token_ids": [...], "text", "replica", "cached",
           "generate_seconds", "queue_seconds", "first_token_seconds"}   (seconds from acceptance)
      400 malformed body · 404 unknown task ID · 409 request ID reused for another task · 413 body too big
    GET /health → {"status": "ok", "model": {...}, "replica", "tasks", "engine": {slots, device, ...}}
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError


from evidence.canonical import read_json, write_json_atomic
from evidence.commitments import CommitmentLog
from evidence.schema import explain
from training import lease
from training.architecture import unservable_dir
from training.errors import TrainError
from training.evaluate import eos_ids, generation_budget, model_dir_for, prompt_text
from training.heap import long_lived
from training.prepare import load_cases, require_prepared
from training.seed import load_tokenizer, quiet_libraries
from training.train import resolved_from_prepared

MAX_BODY_BYTES = 4096
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"


class AnswerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    task_id: str = Field(min_length=1, max_length=64)


class ServeError(TrainError):
    """The replica refuses to start (unverified model, unservable arm, nothing to serve)."""


@dataclass
class Replica:
    """A verified model in its engine, and the committed development tasks it may answer."""

    name: str
    engine: Any  # training.engine.Engine, running
    tokenizer: Any
    device: Any
    tasks: dict[str, dict[str, Any]]
    prompts: dict[str, list[int]]  # each task's prompt token IDs, tokenized once
    identity: dict[str, Any]
    max_new_tokens: int
    engine_facts: dict[str, Any] = field(default_factory=dict)
    cache_size: int = 1024
    device_lock: Any = None  # held for the life of the process (GPU only)
    _cache: OrderedDict = field(default_factory=OrderedDict)
    _pending: dict[str, tuple[str, Future]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, req: AnswerRequest) -> tuple[int, dict[str, Any]] | tuple[None, tuple[Future, bool]]:
        """A refusal or a cached answer now, or the future of the answer and whether it is another
        request's (a repeat of a request still being generated shares its future: cached, as a repeat
        after it would be)."""
        if req.task_id not in self.tasks:
            return 404, {"error": "unknown task",
                         "detail": f"'{req.task_id}' is not a committed development task of this trial"}
        with self._lock:
            hit = self._cache.get(req.request_id)
            pending = self._pending.get(req.request_id)
            task = hit["task_id"] if hit is not None else pending[0] if pending is not None else None
            if task is not None and task != req.task_id:
                return 409, {"error": "request ID reused", "detail": f"request '{req.request_id}' was for task {task}"}
            if hit is not None:
                self._cache.move_to_end(req.request_id)
                return 200, {**hit, "cached": True}
            if pending is not None:
                return None, (pending[1], True)
            done: Future = Future()
            self._pending[req.request_id] = (req.task_id, done)
        try:
            inner = self.engine.submit(self.prompts[req.task_id], self.max_new_tokens)
        except Exception as e:  # noqa: BLE001 — a stopped engine: this request and its repeats fail, none hangs
            with self._lock:
                self._pending.pop(req.request_id, None)
            done.set_exception(e)
            return None, (done, False)
        inner.add_done_callback(lambda f: self._finish(req, f, done))
        return None, (done, False)

    def _finish(self, req: AnswerRequest, f: Future, done: Future) -> None:
        """The engine's answer into the retry cache, then to everyone waiting on it; whatever fails here
        fails the waiters too (a callback's exception would otherwise only be logged, and they would hang)."""
        try:
            a = f.result()
            out = {"request_id": req.request_id, "task_id": req.task_id, "model": self.identity,
                   "token_ids": a.tokens, "text": self.tokenizer.decode(a.tokens, skip_special_tokens=True).strip(),
                   "replica": self.name, "generate_seconds": a.generate_seconds,
                   "queue_seconds": a.queue_seconds, "first_token_seconds": a.first_token_seconds}
        except BaseException as e:  # noqa: BLE001 — the engine's failure, or building the answer's
            with self._lock:
                self._pending.pop(req.request_id, None)
            if not done.done():
                done.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            return
        with self._lock:
            self._pending.pop(req.request_id, None)
            self._cache[req.request_id] = out
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        if not done.done():
            done.set_result(out)

    def answer(self, req: AnswerRequest) -> tuple[int, dict[str, Any]]:
        """One request, waiting for its answer (the HTTP handler awaits the same future instead)."""
        status, got = self.start(req)
        if status is not None:
            return status, got
        future, shared = got
        return 200, {**future.result(), "cached": shared}

    def close(self) -> None:
        self.engine.close()


def load_replica(home: str | os.PathLike[str], *, arm: str | None = None, seed_dir: Path | None = None,
                 name: str = "replica", threads: int | None = None, cache_size: int = 1024) -> Replica:
    with long_lived():  # loaded once, kept to the end: out of the collector's sight (training/heap.py)
        import torch  # here, not at the top: no collector passes while it loads

        from training.engine import DEFAULT_SLOTS, Engine, EngineError, cast_for_serving
        from training.runtime import DeviceShare, device_lock, pick_device
        from training.trainer import parameter_digest

    home = Path(home)
    prepared = require_prepared(home)
    CommitmentLog(home).require("selection", "selection.json")
    selection = read_json(home / "selection.json")
    arm = arm or selection["serving"]
    cfg = resolved_from_prepared(prepared)
    if not cfg.arm(arm).servable:
        raise ServeError(f"arm '{arm}' is marked not servable in the experiment's rules")
    model_dir, receipt_digest = model_dir_for(home, arm, selection, seed_dir, prepared)
    receipt = read_json(model_dir / "receipt.json")
    share = DeviceShare.from_env()  # the probe's replicas sharing GPUs on purpose
    device = pick_device(cfg.profile.device, int(os.environ.get("LOCAL_RANK", "0")), share)
    lock = device_lock(device, share)
    if threads:
        torch.set_num_threads(threads)
    quiet_libraries()
    with long_lived():
        from transformers import AutoModelForCausalLM  # likewise, under long_lived

    if why := unservable_dir(model_dir):  # before the model loads
        raise ServeError(f"{model_dir}: {why}; the replica cannot serve it")
    with long_lived():
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    loaded = parameter_digest(model)
    agreed = receipt["meta"].get("parameters_sha256")
    if agreed is None and arm != selection["baseline"]:
        raise ServeError(f"{model_dir}/receipt.json does not name the parameters the ranks agreed on")
    if agreed is not None and loaded != agreed:
        raise ServeError(f"{model_dir}: loaded parameters hash to {loaded}, the ranks agreed on {agreed}")
    cast_for_serving(model.to(device), getattr(torch, cfg.profile.serving_dtype or "float32"))  # after the digest
    tok = load_tokenizer(model_dir, verified=True)
    tasks = {cid: c for cid, c in load_cases(home).items() if c["split"] == "dev"}
    if not tasks:
        raise ServeError(f"{home} has no development tasks to serve")
    prompts = {cid: tok(prompt_text(tok, c), add_special_tokens=False)["input_ids"] for cid, c in tasks.items()}
    budget = generation_budget(tok, tasks.values())
    slots = cfg.profile.serving_slots or DEFAULT_SLOTS[device.type]
    try:
        with long_lived():  # the engine's weights and caches live as long as the process
            engine = Engine(model, slots=slots, max_len=max(map(len, prompts.values())) + budget,
                            eos=eos_ids(model, tok), device=device, threads=threads,
                            prompt_lengths=[len(p) for p in prompts.values()])
        facts = engine.describe()  # its bandwidth measurement allocates too
    except (EngineError, RuntimeError) as e:  # a cache that does not fit, a graph that cannot be captured
        raise ServeError(f"{name}: the serving engine could not start on {device}: {e}") from None
    del model  # the engine holds what it multiplies
    return Replica(name=name, engine=engine.start(), tokenizer=tok, device=device, tasks=tasks, prompts=prompts,
                   identity={"arm": arm, "receipt_digest": receipt_digest, "parameters_sha256": loaded},
                   max_new_tokens=budget, engine_facts=facts, cache_size=cache_size, device_lock=lock)


def make_app(replica: Replica) -> FastAPI:
    app = FastAPI(title="trial serving replica", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": replica.identity, "replica": replica.name,
                "tasks": len(replica.tasks), "engine": replica.engine_facts}

    @app.post("/v1/answer")
    async def answer(request: Request) -> JSONResponse:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
            return JSONResponse({"error": "body too large", "detail": f"limit {MAX_BODY_BYTES} bytes"}, 413)
        body = bytearray()
        async for chunk in request.stream():  # a chunked body is counted as it arrives
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return JSONResponse({"error": "body too large", "detail": f"limit {MAX_BODY_BYTES} bytes"}, 413)
        try:
            req = AnswerRequest.model_validate_json(bytes(body))
        except ValidationError as e:
            return JSONResponse({"error": "malformed request", "detail": explain(e, "body")}, 400)
        status, got = replica.start(req)
        if status is not None:
            return JSONResponse(got, status)
        future, shared = got
        try:
            # shielded: a waiter cancelled (a client gone, the server stopping) must not cancel the answer
            # its repeats share
            payload = await asyncio.shield(asyncio.wrap_future(future))
        except Exception as e:  # noqa: BLE001 — the engine failed this request: the client may retry elsewhere
            return JSONResponse({"error": "generation failed", "detail": f"{type(e).__name__}: {e}"[:300]}, 500)
        return JSONResponse({**payload, "cached": shared}, 200)

    return app


async def leased(name: str, server: Any) -> None:
    """A replica started over SSH holds a lease on its controller (training/lease.py), renewed while the
    probe runs: once it has gone unrenewed for its length, the replica stops as on SIGTERM, so a
    controller that died (SIGKILL, a lost laptop) leaves no replica serving until the hosts go."""
    held = lease.held()
    if held is None:
        return
    path, length = held
    while not server.should_exit:
        await asyncio.sleep(min(5.0, length / 5))
        if lease.age(path) > length:
            print(f"{name}: no controller has renewed this replica's lease for {lease.age(path):.0f} s "
                  f"(lease {length:g} s): stopping", file=sys.stderr, flush=True)
            server.should_exit = True


def serve(replica: Replica, host: str, port: int, ready_file: Path | None = None) -> None:
    """Listen until SIGINT/SIGTERM. The ready file (port, pid, model) is written only once the socket
    accepts connections, so whoever started the replica can wait for it without guessing."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(make_app(replica), log_level="warning", access_log=False))

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and ready_file is not None:
            write_json_atomic(ready_file, {"host": host, "port": sock.getsockname()[1], "pid": os.getpid(),
                                           "model": replica.identity, "replica": replica.name})
        watch = asyncio.create_task(leased(replica.name, server))
        await task
        watch.cancel()

    try:
        asyncio.run(run())
    finally:
        replica.close()

