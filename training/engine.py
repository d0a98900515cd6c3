"""The serving replica's engine: greedy decoding of many requests in one fixed-shape batch, with every
request's tokens — and logits, bit for bit — independent of what else is in the batch, running the
model's own transformers modules.

Why not `generate()` one request at a time (what the replica did): a 135M model's decode step reads its
weights once whether it serves one row or sixty-four, so one request at a time measured the host's
Python, not the device (29 tokens/s where the same GPU batched did 1,294; #58). Why not batched
`generate()` or transformers' continuous batching: a row's arithmetic there depends on the batch it
lands in — its shape (how many rows, how much padding, which kernel the matmul library picks for that
shape) — and the probe's identity gates rest on a task's tokens never depending on load.

Why the model's own modules (#66): the engine was a hand copy of Llama's forward, so every other
architecture — and every fix transformers makes to one — had to be written here again. Now the model
runs its own decoder: embeddings, norms, its rotary embedding (or learned positions), biases, grouped
query heads, q/k norms, logit soft-capping, sliding windows. The engine owns only what makes a row's
arithmetic its own, through transformers' two seams at the pinned version (5.24):
- the **cache**: every attention module calls `cache.update(key, value, layer_idx, kwargs=...)` after its
  rotary embedding and before attention (models/llama/modeling_llama.py `LlamaAttention.forward`; the same
  in Qwen2/3, Mistral, Phi-3, Gemma 2, GPT-2). `_SlotCache` writes a decode step's keys at each row's own
  position in its own slot (transformers' `StaticCache` keeps one position per layer for the batch);
- the **attention**: `AttentionInterface.register` (modeling_utils.py) — the module calls the registered
  function with its queries, the cache's keys and values, its `scaling`, and where it has them its
  `sliding_window` and `softcap`. `_attend` masks per row (a key is seen by a row's query at its own
  position only), softmax in FP32 as transformers' eager path. A name registered for attention but not
  for masks makes the model skip its own mask building (masking_utils.py `_preprocess_mask_arguments`:
  "custom attention without equivalent mask creation").
Positions go in per row (`position_ids` [slots, 1]); the engine's state reaches the attention through the
forward's keyword arguments, which every model passes down to its attention call.

Batch invariance by construction:
- **one shape for every decode step**: `slots` rows always (an idle slot decodes a dummy token), one
  key/value length (`max_len`) always; so every matmul, softmax and reduction runs with the same shape,
  the same kernel and the same reduction order, whatever the load. No kernel reduces across rows, so a
  row's result is a function of that row's data alone;
- **a row's data does not depend on its neighbours or its slot**: a request's prompt is prefilled alone
  (batch 1, padded to its bucket), its keys and values sit at positions 0.. of its own slot, attention
  masks every other position with exact zeros (a stale key of an earlier request adds 0.0, which changes
  no sum), and positions are per row, so a request that joins mid-decode is computed as if it were alone;
- greedy selection is per row (argmax).
What this cannot promise is invariance across engines of different `slots` or threads: the batch
shape is the profile's (`serving_slots`), the same for every replica of a trial. tests/training/
test_engine.py checks the property bit for bit, neighbours joining and leaving mid-decode, for every
architecture in training/architecture.py's table.

On CUDA the decode step is compiled (inductor, one fixed shape, its deterministic mode: no on-device
benchmarking that could pick different kernels on two replicas) and captured once as a CUDA graph; each
prompt bucket's prefill is captured eager. Greedy tokens equal `generate()`'s except at near-ties
(`NEAR_TIE`): fused kernels round differently from eager ones.
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

from training.architecture import learned_positions, unservable
from training.errors import TrainError

BANDWIDTH_BYTES_PER_S = {  # the vendors' spec sheets (HBM/GDDR peak), by device name fragment
    "H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12, "A100-SXM4-40GB": 1.555e12, "A100": 1.555e12, "L40S": 8.64e11,
    "L4": 3.0e11, "A10G": 6.0e11,
}

PEAK_FLOPS = {  # the vendors' spec sheets, dense: FP32 without tensor cores (TF32 stays off), BF16/FP16 tensor
    "float32": {"H200": 67e12, "H100 PCIe": 51e12, "H100": 67e12, "A100": 19.5e12, "L40S": 91.6e12,
                "L4": 30.3e12, "A10G": 31.2e12},
    "bfloat16": {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12,
                 "L4": 121e12, "A10G": 125e12},
}

NEAR_TIE = {torch.float32: 1e-3, torch.bfloat16: 0.25, torch.float16: 0.05}
"""A greedy pick that differs from `generate()`'s counts as a near-tie (not a wrong token) when, in the
engine's own logits at that step, the two tokens' logits are closer than this (by the serving precision:
about a thousand times its rounding of logits of magnitude ~10). Past a near-tie the two continuations
differ legitimately; `compare_tokens` stops there."""


DEFAULT_SLOTS = {"cuda": 64, "cpu": 4}
"""The batch shape where the profile sets no `serving_slots`: on a GPU a decode step of 64 rows costs
about what one row does (it reads the weights once); on a CPU a row costs compute, and an idle slot
is paid for at every step (bench/results/2026-12-06-serving-engine-cpu)."""

_PASSED = {"position_ids", "use_cache", "output_attentions", "is_causal", "cache_position", "dropout"}
"""Keyword arguments an attention module passes that change nothing here (positions reach `_attend`
through `rows`; no dropout at inference). Any other it passes with a value is refused by name."""


class EngineError(TrainError):
    """The engine cannot serve this model here (its architecture, its size on the device)."""


ROW_INVARIANT_CPU_KERNELS = "DEFAULT"
"""On a CPU, ATen's vectorized elementwise kernels (AVX2, AVX512) run a contiguous tensor's elements in
vector lanes and the last few (numel modulo the vector width) in a scalar loop, and the two compute
transcendental functions differently (SLEEF's vectorized exp against libm's): silu's result for a row
then depends on where the row sits in the batch — seen on this project's 2-core machine, a Llama MLP
row bit-different in slot 2 from slot 0 (tests/training/test_engine.py). ATen's default kernels compute
every element with the scalar functions. The capability is fixed when torch loads
(`ATEN_CPU_CAPABILITY`), so `training serve` sets it before importing torch; an engine in a process
whose CPU kernels are vectorized refuses, saying so. CUDA's elementwise kernels compute every element
with one function, so GPUs are not affected."""


def cpu_kernels() -> str:
    return torch.backends.cpu.get_cpu_capability()


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


@dataclass
class _Rows:
    """What one forward of the engine is: a decode step (every slot, one token each at `pos`) or one
    prompt's prefill (into `slot`, positions 0..T-1). Passed to the model as a keyword argument, so it
    reaches `_SlotCache.update` and `_attend` with the call it belongs to."""

    phase: str
    pos: torch.Tensor | None = None  # [slots] each row's position (decode)
    slot: torch.Tensor | None = None  # [1] the slot a prefill fills
    positions: torch.Tensor | None = None  # arange(max_len)


class _SlotCache:
    """Keys and values per slot, [slots, kv_heads, max_len, head_dim] for each layer, allocated at the
    engine's first decode step from the shapes the model's own attention hands in (so per-layer head
    counts and dimensions are the model's)."""

    def __init__(self, slots: int, max_len: int, layers: int, device: torch.device) -> None:
        self.slots, self.max_len, self.layers, self.device = slots, max_len, layers, device
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.rows = torch.arange(slots, device=device)

    def _allocate(self, layer_idx: int, key: torch.Tensor) -> None:
        if layer_idx != len(self.k):
            raise EngineError(f"the model's attention layers reached the cache out of order (layer {layer_idx} "
                              f"after {len(self.k)}): the engine's cache cannot hold this model")
        shape = (self.slots, key.shape[1], self.max_len, key.shape[3])
        if layer_idx == 0:
            need = 2 * math.prod(shape) * key.element_size() * self.layers
            free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else _available_memory()
            if free is not None and need > free * 0.9:
                raise EngineError(f"the key/value cache of {self.slots} slots × {self.max_len} positions needs "
                                  f"{need / 2**30:.1f} GiB; {self.device} has {free / 2**30:.1f} GiB free: "
                                  "lower serving_slots in the profile")
        self.k.append(torch.zeros(shape, dtype=key.dtype, device=self.device))
        self.v.append(torch.zeros(shape, dtype=key.dtype, device=self.device))

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' `Cache.update` (cache_utils.py): this call's keys and values in, what the layer
        attends over out. Decode: each row's key at its own position of its own slot; the whole slot is
        returned (masked per row by `_attend`). Prefill: the prompt's keys into positions 0.. of its slot;
        attention runs over the prompt's own keys."""
        rows = _rows_of(kwargs)
        if layer_idx == len(self.k):
            self._allocate(layer_idx, key)
        k, v = self.k[layer_idx], self.v[layer_idx]
        if rows.phase == "decode":
            k[self.rows, :, rows.pos] = key[:, :, 0]
            v[self.rows, :, rows.pos] = value[:, :, 0]
            return k, v
        m = key.shape[2]
        k[:, :, :m].index_copy_(0, rows.slot, key)
        v[:, :, :m].index_copy_(0, rows.slot, value)
        return key, value

    def get_seq_length(self, *args: Any, **kwargs: Any) -> int:
        raise EngineError("the model asked its cache for one sequence length; the engine's rows each have "
                          "their own position (it passes position_ids), so it cannot serve this model")

    def clear(self, slot: int) -> None:
        """Nothing of an earlier request stays in `slot`, not even masked (0 × NaN is NaN)."""
        for t in (*self.k, *self.v):
            t[slot].zero_()

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


def _rows_of(kwargs: dict[str, Any]) -> _Rows:
    inner = kwargs.get("kwargs")  # 5.24 passes the forward's keyword arguments as `kwargs=`
    rows = (inner or {}).get("trials_rows") if isinstance(inner, dict) else None
    rows = rows if rows is not None else kwargs.get("trials_rows")
    if rows is None:
        raise EngineError("the model's attention did not pass the forward's keyword arguments on to its cache; "
                          "the engine cannot place its keys per row")
    return rows


ATTENTION = "trials_engine"


def _attend(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scaling: float | None = None,
            sliding_window: int | None = None, softcap: float | None = None, trials_rows: _Rows | None = None,
            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The attention function the engine registers (transformers' `AttentionInterface`): q [B, H, T, d],
    k/v [B, Hkv, S, d] as the cache returned them; out [B, T, H, d], as transformers' own functions return
    it. Grouped heads without copying keys per head; the mask from each row's own position (decode) or
    causal over the prompt (prefill), with the module's sliding window (a key is seen while
    q - k < window, masking_utils.py `sliding_window_overlay`); softcap as transformers' eager Gemma 2."""
    if trials_rows is None:
        raise EngineError("the model's attention did not pass the forward's keyword arguments to the attention "
                          "function; the engine cannot mask its rows")
    odd = sorted(n for n, x in kwargs.items() if n not in _PASSED and x is not None and x is not False)
    if odd:
        raise EngineError(f"the model's attention passes {', '.join(odd)}, which the engine's attention does not "
                          "implement")
    b, h, t, d = q.shape
    hk, s_len = k.shape[1], k.shape[2]
    if h % hk:
        raise EngineError(f"the model's {h} attention heads are not a whole multiple of its {hk} key/value heads")
    g = h // hk
    s = torch.matmul(q.reshape(b, hk, g * t, d), k.transpose(2, 3)) * (scaling if scaling is not None else d ** -0.5)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    kpos = trials_rows.positions[:s_len]
    qpos = trials_rows.pos[:, None] if trials_rows.phase == "decode" else trials_rows.positions[:t][None]
    seen = kpos[None, None, :] <= qpos[..., None]  # [B or 1, T, S]
    if sliding_window is not None:
        seen = seen & (qpos[..., None] - kpos[None, None, :] < sliding_window)
    s = s.view(b, hk, g, t, s_len).masked_fill(~seen[:, None, None], float("-inf"))
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype).view(b, hk, g * t, s_len)
    return torch.matmul(p, v).view(b, h, t, d).transpose(1, 2), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _attend)


def weights_bytes(model: Any) -> int:
    """What one decode step reads of the model's parameters and buffers: each tensor once (tied weights
    once), less an input embedding no output layer shares (a step reads only its B rows)."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    if emb is not None and (out is None or out.weight.data_ptr() != emb.weight.data_ptr()):
        total -= emb.weight.numel() * emb.weight.element_size()
    return total


def compare_tokens(got: list[int], got_logits: list[torch.Tensor], want: list[int],
                   dtype: torch.dtype = torch.float32) -> str:
    """'equal', 'near-tie' (the first differing pick is a near-tie in the engine's logits, by the gap of the
    precision it served in, `dtype`: its logits come out as FP32 whatever it is) or 'differs'."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            lg = got_logits[i].float()
            return "near-tie" if (lg[a] - lg[b]).abs().item() < NEAR_TIE.get(dtype, 1e-3) else "differs"
    return "equal" if len(got) == len(want) else "differs"


def cast_for_serving(model: Any, dtype: torch.dtype) -> Any:
    """The model's parameters in the serving precision, its buffers as they are: `nn.Module.to(dtype)` would
    round the rotary embedding's FP32 frequencies too (`inv_freq`, a buffer), an error in every angle that
    grows with the position — `from_pretrained(dtype=...)` keeps them FP32, and so does this."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


class Engine:
    """Greedy decoding, `slots` requests at a time, in one fixed shape (see the module's docstring).

    `submit()` from any thread; one engine thread admits requests into free slots (prefilling each
    alone), runs decode steps for all slots, and resolves a request's future when it ends (an end
    token, or its budget). `step()` does one round of that by hand, for tests that place neighbours
    exactly. The engine takes the model over: its attention is switched to the engine's."""

    def __init__(self, model: Any, *, slots: int, max_len: int, eos: set[int], device: torch.device,
                 graphs: bool | None = None, threads: int | None = None, bucket: int | None = None,
                 prompt_lengths: Any = (), compile: bool | None = None) -> None:
        why = unservable(model.config)
        if why:
            raise EngineError(why)
        if slots < 1:
            raise EngineError(f"the engine needs at least one slot (got {slots})")
        if device.type == "cpu" and cpu_kernels() != ROW_INVARIANT_CPU_KERNELS:
            raise EngineError(f"this process runs ATen's {cpu_kernels()} CPU kernels, whose vectorized and scalar "
                              "paths round differently, so a request's tokens would depend on its slot: start "
                              "it with ATEN_CPU_CAPABILITY=default (`python -m training serve` does)")
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
        _register()
        model.set_attn_implementation(ATTENTION)
        if model.config._attn_implementation != ATTENTION:
            raise EngineError(f"{type(model).__name__} does not route its attention through transformers' "
                              "AttentionInterface, the seam the engine runs it by")
        self.model = model.to(device).eval().requires_grad_(False)
        self.dtype = next(model.parameters()).dtype
        table = learned_positions(model.config)
        if table is not None and max_len > table:
            raise EngineError(f"a prompt and its new tokens need {max_len} positions; the model's learned position "
                              f"table has {table} (a position past it is a device-side fault, not an answer)")
        layers = getattr(model.config, "num_hidden_layers", None)
        if not isinstance(layers, int) or layers < 1:
            raise EngineError("the model's config names no num_hidden_layers")
        self.cache = _SlotCache(slots, max_len, layers, device)
        self.positions = torch.arange(max_len, device=device)
        # the decode step's inputs and outputs live in fixed buffers: what a CUDA graph replays on
        self.tok = torch.zeros(slots, dtype=torch.long, device=device)
        self.pos = torch.zeros(slots, dtype=torch.long, device=device)
        self._rows = _Rows("decode", pos=self.pos, positions=self.positions)
        self.vocab = model.get_output_embeddings().weight.shape[0]
        self.logits = torch.zeros(slots, self.vocab, dtype=torch.float32, device=device)
        self.next = torch.zeros(slots, dtype=torch.long, device=device)
        self.active: list[Request | None] = [None] * slots
        self.waiting: deque[Request] = deque()
        self._cv = threading.Condition()
        self.graph = None
        self.compiled = False
        self.compile_seconds = 0.0
        self.prefills: dict[int, tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.steps = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._forward = self._decode_forward
        self._prefill_fn = self._prefill_forward
        with torch.inference_mode():
            try:
                self._decode()  # the first call allocates the cache; every later one reuses it
            except EngineError:
                raise
            except (TypeError, ValueError, AttributeError, NotImplementedError, IndexError, KeyError) as e:
                raise EngineError(f"{type(model).__name__} cannot run in the engine: {e}") from None
            self.weights_bytes = weights_bytes(model)
            lengths = sorted({self._padded(n) for n in prompt_lengths})
            if compile if compile is not None else device.type == "cuda":
                self._compile(max(lengths) if lengths else None)
            if graphs if graphs is not None else device.type == "cuda":
                self._capture(lengths)

    # ---------------------------------------------------------------- the model's own forward, per row

    def _decode_forward(self) -> None:
        out = self.model(input_ids=self.tok[:, None], position_ids=self.pos[:, None], cache=self.cache,
                         use_cache=True, trials_rows=self._rows)
        logits = out.logits[:, -1].float()
        self.logits.copy_(logits)
        self.next.copy_(logits.argmax(-1))

    def _decode(self) -> None:
        """One token for every slot: `tok` at `pos` -> `logits`, `next`. Fixed shapes throughout."""
        self._forward()

    def _compile(self, prefill_length: int | None) -> None:
        """The decode step through inductor: one fixed shape (dynamic=False), the whole forward in one graph,
        and inductor's deterministic mode, which skips the on-device benchmarking that could pick another
        kernel (another reduction order) on another replica. The prefill once more, its prompt length
        dynamic: one compilation serves every bucket (each bucket is then captured as its own graph). A
        request's arithmetic never depends on its neighbours either way: the decode step has one shape, and
        a prefill runs alone. Each first call compiles."""
        import torch._inductor.config as inductor

        t = time.perf_counter()
        # process-wide, not patched around the first calls: a later recompile (a guard that fails) would
        # otherwise run without it. A replica's process compiles nothing else.
        if hasattr(inductor, "deterministic"):
            inductor.deterministic = True
        else:  # an older torch: no on-device benchmarking of pointwise configs at least
            inductor.triton.autotune_pointwise = False
        fn = torch.compile(self._decode_forward, fullgraph=True, dynamic=False)
        fn()
        fn()
        self._forward = fn
        if prefill_length is not None:
            pf = torch.compile(self._prefill_forward, fullgraph=True, dynamic=None)
            m = min(self._padded(prefill_length), self.max_len - 1)
            ids = torch.zeros(1, m, dtype=torch.long, device=self.device)
            torch._dynamo.mark_dynamic(ids, 1, min=2, max=self.max_len - 1)
            spare = torch.full((1,), self.slots - 1, dtype=torch.long, device=self.device)
            pf(ids, spare, torch.full((1,), m - 1, dtype=torch.long, device=self.device))
            self._prefill_fn = pf
        self.compiled = True
        self.compile_seconds = time.perf_counter() - t

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
        if not 2 <= ids.shape[1] < self.max_len:  # the compiled prefill's dynamic range (1 and the whole cache
            return self._prefill_forward(ids, slot, last)  # specialize); such a prompt is prefilled eager
        return self._prefill_fn(ids, slot, last)

    def _prefill_forward(self, ids: torch.Tensor, slot: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        m = ids.shape[1]
        rows = _Rows("prefill", slot=slot, positions=self.positions)
        out = self.model(input_ids=ids, position_ids=self.positions[:m][None], cache=self.cache, use_cache=True,
                         logits_to_keep=last, trials_rows=rows)
        return out.logits[0, -1].float()

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
                    self.cache.clear(slot)
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
        """The engine's facts the probe records: its shape, what one decode step reads (weights, and the
        whole key/value cache: every slot over `max_len`, whatever the load) and computes, and the device's
        memory bandwidth and arithmetic peak at the serving precision (spec where the device is known, and
        a measured copy)."""
        import transformers

        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        spec = next((bw for frag, bw in BANDWIDTH_BYTES_PER_S.items() if frag in name), None)
        precision = "float32" if self.dtype == torch.float32 else "bfloat16"
        peak = next((f for frag, f in PEAK_FLOPS[precision].items() if frag in name), None)
        c = self.model.config
        heads = getattr(c, "num_attention_heads", 0) or 0
        head_dim = self.cache.k[0].shape[-1] if self.cache.k else 0
        matmul = 2 * (self.weights_bytes // self.dtype.itemsize) * self.slots
        attention = 4 * len(self.cache.k) * self.slots * heads * self.max_len * head_dim
        return {"slots": self.slots, "max_len": self.max_len, "device": str(self.device), "device_name": name,
                "model_type": c.model_type, "dtype": str(self.dtype).removeprefix("torch."),
                "weights_bytes": self.weights_bytes, "cache_bytes": self.cache.bytes(),
                "step_flops": matmul + attention, "peak_flops": peak,
                "bandwidth_bytes_per_s": spec, "measured_copy_bytes_per_s": copy_bandwidth(self.device),
                "threads": self.threads, "cpu_kernels": cpu_kernels(), "cuda_graph": self.graph is not None, "compiled": self.compiled,
                "compile_seconds": round(self.compile_seconds, 3), "torch": torch.__version__,
                "transformers": transformers.__version__}


def step_bound(facts: dict[str, Any]) -> dict[str, Any] | None:
    """The fastest a decode step of this engine can be: max(bytes it reads / bandwidth, its arithmetic /
    peak) — the weights once, the whole cache once (one shape: the step reads every slot over max_len), the
    matmuls of every slot. None where the device has no bandwidth (spec or measured)."""
    bw = facts.get("bandwidth_bytes_per_s") or facts.get("measured_copy_bytes_per_s")
    if not bw:
        return None
    memory = (facts["weights_bytes"] + facts.get("cache_bytes", 0)) / bw
    compute = facts["step_flops"] / facts["peak_flops"] if facts.get("peak_flops") and facts.get("step_flops") else 0.0
    return {"seconds": max(memory, compute), "memory_seconds": memory, "compute_seconds": compute,
            "bound_by": "memory" if memory >= compute else "arithmetic",
            "bandwidth_from": "spec" if facts.get("bandwidth_bytes_per_s") else "measured copy"}


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
