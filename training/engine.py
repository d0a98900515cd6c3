"""The serving replica's engine: greedy decoding of many requests in one fixed-shape batch, with every
request's tokens — and logits, bit for bit — independent of what else is in the batch.

Why not `generate()` one request at a time (what the replica did): a 135M model's decode step reads its
weights once whether it serves one row or sixty-four, so one request at a time measured the host's
Python, not the device (29 tokens/s where the same GPU batched did 1,294; #58). Why not batched
`generate()` or transformers' continuous batching: a row's arithmetic there depends on the batch it
lands in — its shape (how many rows, how much padding, which kernel the matmul library picks for that
shape) — and the probe's identity gates rest on a task's tokens never depending on load.

Batch invariance by construction:
- **one shape for every decode step**: `slots` rows always (an idle slot decodes a dummy token), one
  key/value length (`max_len`) always; so every matmul, softmax and reduction runs with the same shape,
  the same kernel and the same reduction order, whatever the load. No kernel reduces across rows, so a
  row's result is a function of that row's data alone;
- **a row's data does not depend on its neighbours or its slot**: a request's prompt is prefilled alone
  (batch 1, its own length), its keys and values sit at positions 0.. of its own slot, attention masks
  every other position with exact zeros (a stale key of an earlier request adds 0.0, which changes no
  sum), and positions are per row, so a request that joins mid-decode is computed as if it were alone;
- greedy selection is per row (argmax).
What this cannot promise is invariance across engines of different `slots` or threads: the batch
shape is the profile's (`serving_slots`), the same for every replica of a trial. tests/training/
test_engine.py checks the property bit for bit, neighbours joining and leaving mid-decode.

The model is a Llama-architecture decoder (the seeds are; training/architecture.py names what else
is refused). The
forward pass mirrors transformers' Llama (RMSNorm in FP32, rotary embedding from FP32 positions,
softmax in FP32) so its greedy tokens are those of `generate()` where the top logit is not a near-tie.
On CUDA the decode step is captured once as a CUDA graph and replayed: one launch per step instead of
~1,000 kernel launches from Python, which is what made one request at a time slow.
"""

from __future__ import annotations

import math
import threading
from collections import deque
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from training.architecture import unservable
from training.errors import TrainError

BANDWIDTH_BYTES_PER_S = {  # the vendors' spec sheets (HBM/GDDR peak), by device name fragment
    "H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12, "A100-SXM4-40GB": 1.555e12, "A100": 1.555e12, "L40S": 8.64e11,
    "L4": 3.0e11, "A10G": 6.0e11,
}


DEFAULT_SLOTS = {"cuda": 64, "cpu": 4}
"""The batch shape where the profile sets no `serving_slots`: on a GPU a decode step of 64 rows costs
about what one row does (it reads the weights once); on a CPU a row costs compute, and an idle slot
is paid for at every step (bench/results/2026-12-06-serving-engine-cpu)."""


class EngineError(TrainError):
    """The engine cannot serve this model here (its architecture, its size on the device)."""


@dataclass
class Request:
    """One request in the engine: its prompt, its budget, and where its answer goes."""

    prompt: list[int]
    max_new: int
    future: Future = field(default_factory=Future)
    keep_logits: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    first_token: float | None = None
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    slot: int | None = None


@dataclass
class Answer:
    tokens: list[int]
    queue_seconds: float
    first_token_seconds: float
    generate_seconds: float
    slot: int
    logits: list[torch.Tensor] | None = None


class _Weights:
    """The model's tensors as the engine multiplies them: q/k/v and gate/up each one matrix (one matmul
    instead of three and two), everything contiguous on the device."""

    def __init__(self, model: Any, device: torch.device) -> None:
        c = model.config
        m = model.model
        self.embed = m.embed_tokens.weight.detach().to(device)
        self.layers = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                layer.input_layernorm.weight.detach().to(device),
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach().to(device).contiguous(),
                a.o_proj.weight.detach().to(device).contiguous(),
                layer.post_attention_layernorm.weight.detach().to(device),
                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach().to(device).contiguous(),
                mlp.down_proj.weight.detach().to(device).contiguous(),
            ))
        self.norm = m.norm.weight.detach().to(device)
        self.lm_head = model.lm_head.weight.detach().to(device)
        self.eps = c.rms_norm_eps
        self.heads = c.num_attention_heads
        self.kv_heads = c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.intermediate = c.intermediate_size
        theta = c.rope_parameters["rope_theta"]
        d = self.head_dim
        self.inv_freq = (1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))).to(device)
        seen: set[int] = set()
        self.bytes = 0  # what one decode step reads of weights (the embedding's B rows aside; tied once)
        for t in [self.norm, self.lm_head, *(w for ws in self.layers for w in ws)]:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                self.bytes += t.numel() * t.element_size()


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Engine:
    """Greedy decoding, `slots` requests at a time, in one fixed shape (see the module's docstring).

    `submit()` from any thread; one engine thread admits requests into free slots (prefilling each
    alone), runs decode steps for all slots, and resolves a request's future when it ends (an end
    token, or its budget). `step()` does one round of that by hand, for tests that place neighbours
    exactly."""

    def __init__(self, model: Any, *, slots: int, max_len: int, eos: set[int], device: torch.device,
                 graphs: bool | None = None, threads: int | None = None, bucket: int | None = None,
                 prompt_lengths: Any = ()) -> None:
        why = unservable(model.config)
        if why:
            raise EngineError(why)
        if slots < 1:
            raise EngineError(f"the engine needs at least one slot (got {slots})")
        self.device = device
        self.slots = slots
        # a prompt is prefilled padded to a multiple of `bucket` tokens (the padding after it, never seen
        # by it): one shape per bucket, so on CUDA one captured graph each (`prompt_lengths`' buckets are
        # captured at start) — the prefill of a few hundred tokens is otherwise ~1,000 kernel launches
        # from Python, longer than the request's decode at 16 in flight. On a CPU padding is only cost.
        self.bucket = bucket or (32 if device.type == "cuda" else 1)
        self.max_len = max_len
        self.eos = set(eos)
        self.threads = threads
        self.w = _Weights(model, device)
        w = self.w
        dtype = w.embed.dtype
        shape = (len(w.layers), slots, w.kv_heads, max_len, w.head_dim)
        need = 2 * math.prod(shape) * w.embed.element_size()
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else _available_memory()
        if free is not None:
            if need > free * 0.9:
                raise EngineError(f"the key/value cache of {slots} slots × {max_len} positions needs "
                                  f"{need / 2**30:.1f} GiB; {device} has {free / 2**30:.1f} GiB free: "
                                  "lower serving_slots in the profile")
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.positions = torch.arange(max_len, device=device)
        self.rows = torch.arange(slots, device=device)
        # the decode step's inputs and outputs live in fixed buffers: what a CUDA graph replays on
        self.tok = torch.zeros(slots, dtype=torch.long, device=device)
        self.pos = torch.zeros(slots, dtype=torch.long, device=device)
        self.logits = torch.zeros(slots, w.lm_head.shape[0], dtype=torch.float32, device=device)
        self.next = torch.zeros(slots, dtype=torch.long, device=device)
        self.active: list[Request | None] = [None] * slots
        self.waiting: deque[Request] = deque()
        self._cv = threading.Condition()
        self.graph = None
        self.prefills: dict[int, tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.steps = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        with torch.inference_mode():
            self._decode()  # the first call allocates what every later one reuses
            if graphs if graphs is not None else device.type == "cuda":
                self._capture(sorted({self._padded(n) for n in prompt_lengths}))

    # ---------------------------------------------------------------- the model, mirrored from Llama

    def _layers(self, x: torch.Tensor, pos: torch.Tensor, attend: Any) -> torch.Tensor:
        """x [B, T, hidden] at positions pos [B, T]; `attend(i, q, k, v)` writes layer i's keys and values
        where they belong and returns the attention output [B, heads, T, head_dim]."""
        w = self.w
        freqs = pos[..., None].float() * w.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, :, None].to(x.dtype), emb.sin()[:, :, None].to(x.dtype)  # [B, T, 1, d]
        b, t, _ = x.shape
        hq, hk, d = w.heads * w.head_dim, w.kv_heads * w.head_dim, w.head_dim
        for i, (ln1, qkv, o, ln2, gate_up, down) in enumerate(w.layers):
            h = F.linear(_rms(x, ln1, w.eps), qkv)
            qk = _rotate(h[..., :hq + hk].view(b, t, w.heads + w.kv_heads, d), cos, sin)  # one rotation for both
            v = h[..., hq + hk:].view(b, t, w.kv_heads, d).transpose(1, 2)
            a = attend(i, qk[:, :, :w.heads].transpose(1, 2), qk[:, :, w.heads:].transpose(1, 2), v)
            x = x + F.linear(a.transpose(1, 2).reshape(b, t, hq), o)
            g, u = F.linear(_rms(x, ln2, w.eps), gate_up).split(w.intermediate, dim=-1)
            x = x + F.linear(F.silu(g) * u, down)
        return x

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_rms(x, self.w.norm, self.w.eps), self.w.lm_head).float()

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention without copying keys per head: q [B, H, T, d] as [B, Hkv, G·T, d];
        `mask` [B, 1, T or 1, L] True where a key may be seen. Softmax in FP32, as transformers' eager path."""
        b, h, t, d = q.shape
        g = h // self.w.kv_heads
        qg = q.reshape(b, self.w.kv_heads, g * t, d)
        s = torch.matmul(qg, k.transpose(2, 3)) * (d ** -0.5)
        s = s.view(b, self.w.kv_heads, g, t, -1).masked_fill(~mask[:, :, None], float("-inf"))
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype).view(b, self.w.kv_heads, g * t, -1)
        return torch.matmul(p, v).view(b, h, t, d)

    def _padded(self, n: int) -> int:
        return min(-(-n // self.bucket) * self.bucket, self.max_len)

    def _prefill(self, slot: int, prompt: list[int]) -> torch.Tensor:
        """The prompt alone (batch 1, padded to its bucket after its last token): keys and values into
        positions 0.. of `slot`; the logits of its last position. Padding is seen by no position of the
        prompt (causal) and its keys sit beyond the request's position until decoding overwrites them."""
        n, m = len(prompt), self._padded(len(prompt))
        if m in self.prefills:
            graph, ids, slot_t, last, out = self.prefills[m]
            ids.copy_(torch.tensor([prompt + [0] * (m - n)]))
            slot_t.fill_(slot)
            last.fill_(n - 1)
            graph.replay()
            return out
        ids = torch.tensor([prompt + [0] * (m - n)], dtype=torch.long, device=self.device)
        return self._prefill_padded(ids, torch.tensor([slot], device=self.device),
                                    torch.tensor([n - 1], device=self.device))

    def _prefill_padded(self, ids: torch.Tensor, slot: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        m = ids.shape[1]
        pos = self.positions[:m][None]
        causal = (self.positions[:m, None] >= self.positions[None, :m])[None, None]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[i][:, :, :m].index_copy_(0, slot, k)
            self.v[i][:, :, :m].index_copy_(0, slot, v)
            return self._attention(q, k, v, causal)

        x = self._layers(self.w.embed[ids], pos, attend)
        return self._head(x[0].index_select(0, last))[0]

    def _decode(self) -> None:
        """One token for every slot: `tok` at `pos` -> `logits`, `next`. Fixed shapes throughout."""
        pos = self.pos[:, None]
        seen = (self.positions[None, :] <= pos)[:, None, None]  # [B, 1, 1, L]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[i][self.rows, :, self.pos] = k[:, :, 0]
            self.v[i][self.rows, :, self.pos] = v[:, :, 0]
            return self._attention(q, self.k[i], self.v[i], seen)

        x = self._layers(self.w.embed[self.tok][:, None], pos, attend)
        self.logits.copy_(self._head(x[:, 0]))
        self.next.copy_(self.logits.argmax(-1))

    def _capture(self, prefill_lengths: list[int]) -> None:
        """The decode step, and the prefill of each padded length, as CUDA graphs (each its own memory
        pool: they replay in any order)."""

        def capture(run: Any) -> Any:
            s = torch.cuda.Stream(self.device)
            s.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(s):
                for _ in range(2):
                    run()
            torch.cuda.current_stream(self.device).wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = run()
            return graph, out

        self.graph, _ = capture(self._decode)
        spare = self.slots - 1  # warm-up and capture write into the last slot's cache: it holds no request yet
        for m in prefill_lengths:
            ids = torch.zeros(1, m, dtype=torch.long, device=self.device)
            slot = torch.full((1,), spare, dtype=torch.long, device=self.device)
            last = torch.full((1,), m - 1, dtype=torch.long, device=self.device)
            graph, out = capture(lambda: self._prefill_padded(ids, slot, last))
            self.prefills[m] = (graph, ids, slot, last, out)
        torch.cuda.synchronize(self.device)

    # ---------------------------------------------------------------- scheduling

    def submit(self, prompt: list[int], max_new: int, *, keep_logits: bool = False) -> Future:
        """Queue a request; its future resolves to an `Answer` (or the exception that ended it)."""
        if not prompt or max_new < 1:
            raise EngineError(f"a request needs a prompt and at least one new token (got {len(prompt)} and {max_new})")
        if len(prompt) + max_new - 1 > self.max_len:
            raise EngineError(f"a prompt of {len(prompt)} tokens with {max_new} new ones exceeds the engine's "
                              f"{self.max_len} positions")
        r = Request(prompt=list(prompt), max_new=max_new, keep_logits=keep_logits)
        with self._cv:
            if self._stop.is_set():
                raise EngineError("the engine has stopped")
            self.waiting.append(r)
            self._cv.notify()
        return r.future

    def _emit(self, r: Request, logits: torch.Tensor, token: int) -> bool:
        """Record one generated token; True when the request has ended."""
        if r.first_token is None:
            r.first_token = time.perf_counter()
        r.tokens.append(token)
        if r.keep_logits:
            r.logits.append(logits.detach().to("cpu", copy=True))
        if token in self.eos or len(r.tokens) >= r.max_new:
            now = time.perf_counter()
            r.future.set_result(Answer(tokens=r.tokens, queue_seconds=r.admitted - r.submitted,
                                       first_token_seconds=r.first_token - r.submitted,
                                       generate_seconds=now - r.submitted, slot=r.slot,
                                       logits=r.logits if r.keep_logits else None))
            return True
        return False

    def admit(self) -> int:
        """Move waiting requests into free slots (lowest first), prefilling each; how many came in."""
        n = 0
        for slot in range(self.slots):
            if self.active[slot] is not None:
                continue
            with self._cv:
                if not self.waiting:
                    break
                r = self.waiting.popleft()
            if not r.future.set_running_or_notify_cancel():
                continue
            r.slot, r.admitted = slot, time.perf_counter()
            try:
                with torch.inference_mode():
                    self.k[:, slot].zero_()  # nothing of an earlier request stays, not even masked (0 × NaN is NaN)
                    self.v[:, slot].zero_()
                    logits = self._prefill(slot, r.prompt)
                    token = int(logits.argmax())
            except Exception as e:  # noqa: BLE001 — the request fails, the engine goes on
                r.future.set_exception(e)
                continue
            n += 1
            if not self._emit(r, logits, token):
                self.active[slot] = r
        return n

    def step(self) -> int:
        """Admit what waits, then one decode step for every slot; how many requests were decoding."""
        self.admit()
        live = [(s, r) for s, r in enumerate(self.active) if r is not None]
        if not live:
            return 0
        tok = [0] * self.slots
        pos = [0] * self.slots
        for s, r in live:
            tok[s] = r.tokens[-1]
            pos[s] = len(r.prompt) + len(r.tokens) - 1
        try:
            with torch.inference_mode():
                self.tok.copy_(torch.tensor(tok), non_blocking=False)
                self.pos.copy_(torch.tensor(pos), non_blocking=False)
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self._decode()
                nxt = self.next.tolist()
        except Exception as e:  # noqa: BLE001 — every request in the step fails; the engine goes on
            for s, r in live:
                r.future.set_exception(e)
                self.active[s] = None
            return len(live)
        self.steps += 1
        for s, r in live:
            if self._emit(r, self.logits[s], nxt[s]):
                self.active[s] = None
        return len(live)

    def start(self) -> "Engine":
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        """The engine thread. However it ends (close, or a bug outside a step's own guard), it stops taking
        requests and fails every one it holds: nothing waits forever on a thread that is gone."""
        why: BaseException | None = None
        try:
            if self.threads:
                torch.set_num_threads(self.threads)
            while not self._stop.is_set():
                if self.step() == 0:
                    with self._cv:  # idle: sleep until a request (or close) arrives
                        while not self.waiting and not self._stop.is_set():
                            self._cv.wait()
        except BaseException as e:  # noqa: BLE001 — said to every request below
            why = e
        finally:
            with self._cv:
                self._stop.set()
                left = [*(r for r in self.active if r is not None), *self.waiting]
                self.waiting.clear()
                self.active = [None] * self.slots
            for r in left:
                try:
                    r.future.set_exception(EngineError("the engine stopped" + (f": {why!r}" if why else "")))
                except InvalidStateError:  # resolved or cancelled meanwhile
                    pass

    def close(self) -> None:
        with self._cv:
            self._stop.set()
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # ---------------------------------------------------------------- what the report compares against

    def describe(self) -> dict[str, Any]:
        """The engine's facts the probe records: its shape, the weights one decode step reads, and the
        device's memory bandwidth (spec when the device is known, and a measured copy)."""
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        spec = next((bw for frag, bw in BANDWIDTH_BYTES_PER_S.items() if frag in name), None)
        return {"slots": self.slots, "max_len": self.max_len, "device": str(self.device), "device_name": name,
                "weights_bytes": self.w.bytes, "bandwidth_bytes_per_s": spec,
                "measured_copy_bytes_per_s": copy_bandwidth(self.device), "threads": self.threads,
                "cuda_graph": self.graph is not None}


def _available_memory() -> int | None:
    """This machine's available memory (Linux), or None where it cannot be read."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def copy_bandwidth(device: torch.device, nbytes: int = 256 * 2**20) -> float:
    """Bytes per second one device-to-device copy moves (read + write), best of three: the bound a
    device without a spec sheet entry (a CPU) is measured against."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(3):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best
