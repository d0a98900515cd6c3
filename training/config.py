"""Experiments are data: `config/experiments/<name>.toml`, validated here.

An experiment fixes its rules (arms, weights, thresholds, the outer optimizer, the primary
candidate); a profile scales it (document counts, updates, context, seed model, device) without
touching those rules. `resolve(name, profile)` merges the two into one frozen `Resolved` object,
whose canonical JSON goes into `prepared.json`, so hosts never need the TOML files themselves.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from evidence.canonical import canonical_sha256
from evidence.errors import UserError
from evidence.schema import problems
from evidence.serving import REQUESTS as SERVING_REQUESTS
from training.arms import KINDS, kind as arm_kind


class ConfigError(UserError, ValueError):
    """A bad experiment or profile: the message names the thing and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Arm(_Strict):
    """One arm of an experiment. `kind` names a module of `training.arms`; the kinds' settings are
    flat keys here (the TOML stays flat and every arm's canonical JSON keeps one shape), and an arm
    may give only its own kind's: each kind's `Settings` model validates them when the arm trains."""

    name: str
    kind: str
    world_size: int = 1
    data: Literal["clean", "damaged"] = "clean"
    microbatch: int | None = None
    # the kinds' settings (training.arms.diloco, training.arms.powersgd)
    sync_every: int | None = None  # DiLoCo H
    outer_lr: float | None = None
    outer_momentum: float | None = None
    powersgd_rank: int | None = None
    dense_warmup: int | None = None
    servable: bool = True

    @model_validator(mode="after")
    def _kind(self) -> "Arm":
        kind = arm_kind(self.kind)
        kind.check_world(self.world_size)
        settings = self.model_dump(include=settings_keys())
        if foreign := kind.foreign(settings):
            raise ValueError(f"arm {self.name} ({self.kind}) does not take {', '.join(foreign)}")
        return self

    @property
    def trains(self) -> bool:
        return arm_kind(self.kind).trains


def settings_keys() -> set[str]:
    """Arm's keys that some registered kind's `Settings` model owns."""
    owned = {f for k in KINDS.values() for f in k.settings_model.model_fields}
    return {f for f in Arm.model_fields if f in owned}


class Weights(_Strict):
    task: int = 8
    replay: int = 1


class Acceptance(_Strict):
    primary: str
    min_gain_pp: float
    p_max: float = 0.01
    confidence: float = 0.99
    retention_max_nats: float = 0.02
    noninferiority_vs: str | None = None
    noninferiority_pp: float | None = None
    max_bytes_ratio_vs: str | None = None
    max_bytes_ratio: float | None = None
    max_active_ratio: float | None = None
    min_speedup_vs: str | None = None
    min_speedup: float | None = None


def check_pack(device_type: str, pack: bool, compile: bool) -> None:
    """Packed rows on CUDA only inside the compiled decoder: on CUDA, Hugging Face's own compiled
    wrapper around FlexAttention fails in Inductor's lowering
    of the backward (NoValidChoicesError; bench/results/README.md, "CUDA tests"); inside the compiled decoder it trains as padded does.
    Checked for a profile and again by the trainer, for any spec."""
    if pack and device_type == "cuda" and not compile:
        raise ValueError("pack = true on CUDA needs compile = true (FlexAttention runs inside the "
                         "compiled decoder)")


class Profile(_Strict):
    seed: Literal["tiny", "smollm2-135m", "local"]
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"
    tasks: int
    replay: int
    dev: int
    test: int
    probes: int
    updates: int
    global_batch: int | None = None  # default: the experiment's
    max_context: int
    records: tuple[int, int] = (4, 8)
    replay_steps: tuple[int, int] = (3, 8)
    replay_parts: tuple[int, int] = (1, 1)
    sync_every: int | None = None  # scales DiLoCo's H with the number of updates
    dense_warmup: int | None = None  # scales PowerSGD's dense warmup with the number of updates
    # publish a group checkpoint every N updates (and the last); 0: none; unset: `Resolved.checkpoint_interval`'s
    # default, applied at run time and kept out of the digest, so a stopped arm of any profile resumes
    checkpoint_every: int | None = None
    # the exact cases of a task file, per split: a JSON file {"train": [ids], "dev": [...], "test": [...]} of
    # the file's own `id`s, relative to the experiment's TOML (unset: a seeded draw; `training.sources`)
    case_ids: str | None = None
    compile: bool = False  # torch.compile the training step's model (fuses norms, RoPE, SwiGLU)
    fused_optimizer: bool = False  # AdamW's fused CUDA kernel instead of the foreach one
    pack: bool = False  # a microbatch's documents in one row (no padding); FlexAttention on CUDA
    pack_tokens: int | None = None  # packed rows of exactly this many tokens, filled first-fit (one shape)
    pack_rows: int = 1  # that many such rows per forward (the same sum; fewer casts and accumulations)
    score_batch: int = 16  # test/dev cases generated together (left-padded greedy decoding)
    score_dtype: Literal["float32", "bfloat16"] = "float32"  # generation's autocast on CUDA (probes stay FP32)
    serving_requests: int | None = None  # the serving probe's requests per phase and level (None: the studies' 64)
    # the probe's concurrency levels, ascending: each phase runs its requests at every one, that many in
    # flight (None: the studies' sweep 1, 4, 16, 64 up to serving_requests; evidence/serving.py)
    serving_concurrency: tuple[int, ...] | None = None
    # the replica engine's batch shape: every decode step runs this many rows (None: training/engine.py's
    # DEFAULT_SLOTS for the device); one shape, so a task's tokens never depend on load
    serving_slots: int | None = None
    # the precision the replica serves in (weights, activations, key/value cache): its parameters are loaded
    # and checked against the digest the ranks agreed on in FP32, then cast; None: float32, whatever `dtype`
    # trained the model (training keeps FP32 master weights; bf16 serving reads half the bytes per step)
    serving_dtype: Literal["float32", "bfloat16"] | None = None
    # every kernel deterministic (torch.use_deterministic_algorithms, cuBLAS's fixed workspace): two runs of
    # the same inputs equal bit for bit on CUDA, so a recovery can be compared exactly (docs/training.md)
    deterministic: bool = False
    written_keys: ClassVar[tuple[str, ...]] = ("base",)  # expanded before validation (`inherit_profiles`)

    @model_validator(mode="after")
    def _ranges(self) -> "Profile":
        if not 2 <= self.records[0] <= self.records[1]:
            raise ValueError("records must be [lo, hi] with 2 <= lo <= hi (a one-record task "
                             "has no wrong order or wrong sum to damage)")
        for name in ("replay_steps", "replay_parts"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be [lo, hi] with 1 <= lo <= hi")
        for name in ("tasks", "replay", "test", "probes", "updates", "max_context", "score_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise ValueError("checkpoint_every must be at least 0 (0: no checkpoints; unset: a quarter of the updates)")
        if self.dev < 0:  # 0: a study without dev cases; the serving probe (its requests are dev cases) is not run
            raise ValueError("dev must be at least 0")
        if self.serving_slots is not None and not 1 <= self.serving_slots <= 256:
            raise ValueError("serving_slots must be between 1 and 256 (the rows of one decode step)")
        if self.serving_requests is not None and self.serving_requests < 4:
            raise ValueError("serving_requests must be at least 4, the probe's client concurrency")
        if self.serving_concurrency is not None:
            levels, requests = self.serving_concurrency, self.serving_requests or SERVING_REQUESTS
            if not levels or any(c < 1 for c in levels) or any(a >= b for a, b in zip(levels, levels[1:])):
                raise ValueError(f"serving_concurrency = {list(levels)}: the probe's concurrency levels must be "
                                 "at least 1 each and strictly ascending, e.g. [1, 4, 16, 64]")
            if levels[-1] > requests:
                raise ValueError(f"serving_concurrency = {list(levels)}: level {levels[-1]} is above the "
                                 f"{requests} requests per phase and level (serving_requests), so it could never have "
                                 f"that many in flight; drop it or set serving_requests to at least {levels[-1]}")
        if self.pack_tokens is not None and (not self.pack or self.pack_tokens < self.max_context):
            raise ValueError("pack_tokens needs pack = true and at least max_context tokens (a row "
                             "must hold the longest document)")
        if self.pack_rows < 1 or (self.pack_rows > 1 and self.pack_tokens is None):
            raise ValueError("pack_rows needs pack_tokens (rows of one width to stack) and is at least 1")
        check_pack(self.device, self.pack, self.compile)
        return self


class Experiment(_Strict):
    name: str
    description: str
    generator_seed: int
    previous: str | None = None  # the experiment whose tasks must not recur
    global_batch: int
    lr: float
    warmup: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    damaged_fraction: float = 0.25
    heldout_test_fraction: float = 0.5
    # the user's own cases (`training.sources`), a JSONL path relative to this file's directory;
    # unset: the generated families
    task_file: str | None = None
    serving_arm: str
    weights: Weights = Field(default_factory=Weights)
    arms: list[Arm]
    acceptance: Acceptance
    profiles: dict[str, Profile]
    _directory: Path | None = PrivateAttr(default=None)  # where the TOML was read: task_file is relative to it

    def task_path(self) -> Path:
        """The task file, where this experiment was loaded from its TOML (hosts never read it: the
        committed `inputs/tasks.jsonl` holds its cases)."""
        if self.task_file is None or self._directory is None:
            raise ConfigError(f"experiment {self.name}'s task file is read only beside its TOML "
                              "(prepare it where the experiment file is)")
        return (self._directory / self.task_file).resolve()

    @model_validator(mode="after")
    def _arms_consistent(self) -> "Experiment":
        names = [a.name for a in self.arms]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"arms: more than one arm is named {', '.join(twice)}: give each arm its own name")
        refs = {"serving_arm": self.serving_arm, **{f"acceptance.{k}": getattr(self.acceptance, k) for k in (
            "primary", "noninferiority_vs", "max_bytes_ratio_vs", "min_speedup_vs")}}
        for key, ref in refs.items():
            if ref is not None and ref not in names:
                raise ValueError(f"{key} = \"{ref}\" names no arm: name one of the arms ({', '.join(names)})")
        return self


LATER_PROFILE_KEYS = {"serving_requests", "serving_concurrency", "deterministic", "serving_slots", "case_ids",
                      "serving_dtype"}
"""Profile keys that came after homes were committed: left out of the resolved study while unset, so that
every earlier home's experiment digest stands (a profile that sets one commits it)."""


DEFAULT_CHECKPOINTS = 4
"""Group checkpoints per arm where a profile of a task-file study sets no `checkpoint_every`: a stop loses at
most a quarter."""


class Resolved(_Strict):
    """One experiment at one profile: everything a stage needs, with one digest."""

    experiment: Experiment
    profile_name: str
    profile: Profile

    @property
    def global_batch(self) -> int:
        return self.profile.global_batch or self.experiment.global_batch

    @property
    def documents(self) -> int:
        return self.profile.tasks + self.profile.replay

    @property
    def split_counts(self) -> dict[str, int]:
        """How many cases each split takes from the task source."""
        return {"train": self.profile.tasks, "dev": self.profile.dev, "test": self.profile.test}

    @property
    def checkpoint_interval(self) -> int:
        """The updates between group checkpoints that run (0: none): the profile's `checkpoint_every`, else,
        for a study of the user's own cases (a `task_file`), `DEFAULT_CHECKPOINTS` of them over the arm: a
        profile its writer never gave checkpoints still resumes a stopped arm from its last quarter, not from
        update 0. The default stays out of the digest (the profile's own value, null, is what is committed),
        so every home prepared before it stands. The built-in studies' profiles keep what they chose: a full
        state is gigabytes per rank and every checkpoint is kept as evidence, so each sized its own (the
        main job's cpu profile writes none)."""
        if self.profile.checkpoint_every is not None:
            return self.profile.checkpoint_every
        if self.experiment.task_file is None:  # the built-in studies: each profile's disk chose (docs/gpu-study.md)
            return 0
        return -(-self.profile.updates // DEFAULT_CHECKPOINTS)

    def case_ids_path(self) -> Path | None:
        """The profile's pinned case ids (`case_ids`), beside the experiment's TOML."""
        if self.profile.case_ids is None:
            return None
        if self.experiment._directory is None:
            raise ConfigError(f"experiment {self.experiment.name}'s case_ids are read only beside its TOML")
        return (self.experiment._directory / self.profile.case_ids).resolve()

    @property
    def epochs(self) -> int:
        return self.profile.updates * self.global_batch // self.documents

    def docs_per_rank(self, arm: Arm) -> int:
        return self.global_batch // arm.world_size

    def arm_settings(self, arm: Arm) -> dict[str, Any]:
        """The settings `arm`'s kind runs with: the arm's own, with the keys its kind lets a profile
        scale (`profile_scaled`: DiLoCo's H, PowerSGD's dense warmup) taken from the profile where it
        sets them. `resolve` has refused every profile value that would not take effect this way."""
        kind = arm_kind(arm.kind)
        return {k: (getattr(self.profile, k) if k in kind.profile_scaled and getattr(self.profile, k, None)
                    is not None else getattr(arm, k, None)) for k in kind.settings_model.model_fields}

    def scaled(self) -> list[tuple[str, str, Any, Any]]:
        """(arm, key, the arm's own value, the profile's) for every arm setting this profile scales:
        said wherever the resolved study is shown, since the arm's own value does not run."""
        out = []
        for a in self.experiment.arms:
            for k in arm_kind(a.kind).profile_scaled:
                v = getattr(self.profile, k, None)
                if v is not None:
                    out.append((a.name, k, getattr(a, k, None), v))
        return out

    def arm(self, name: str) -> Arm:
        for a in self.experiment.arms:
            if a.name == name:
                return a
        raise ConfigError(
            f"experiment {self.experiment.name} has no arm '{name}' "
            f"(arms: {', '.join(a.name for a in self.experiment.arms)})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            # task_file came after homes were committed: left out while unset, as serving_requests below
            "experiment": self.experiment.model_dump(mode="json", exclude={"profiles"} | (
                set() if self.experiment.task_file else {"task_file"})),
            "profile_name": self.profile_name,
            "profile": self.profile.model_dump(mode="json", exclude={k for k in LATER_PROFILE_KEYS
                                                                     if not getattr(self.profile, k)}),
        }

    def digest(self) -> str:
        return canonical_sha256(self.as_dict())


def config_dir() -> Path:
    """`$TRIAL_CONFIG_DIR`, else the nearest `config/experiments` above the cwd or this package."""
    env = os.environ.get("TRIAL_CONFIG_DIR")
    if env:
        return Path(env)
    for base in (Path.cwd(), Path(__file__).resolve().parent):
        for d in (base, *base.parents):
            cand = d / "config" / "experiments"
            if cand.is_dir():
                return cand
    raise ConfigError(
        "no config/experiments directory found; run from the project checkout or set TRIAL_CONFIG_DIR"
    )


def experiment_names(directory: Path | None = None) -> list[str]:
    d = directory or config_dir()
    return sorted(p.stem for p in d.glob("*.toml"))


def inherit_profiles(tables: dict[str, Any], where: Path | str) -> dict[str, Any]:
    """Profiles as written, with `base = "<profile>"` expanded: the base's keys (after its own base),
    then the profile's own. Only the TOML is shorter: the resolved profile, its canonical JSON and
    digest hold every key and never `base`, so a profile reads the same whether written out or
    derived."""
    done: dict[str, dict[str, Any]] = {}

    def expand(name: str, trail: tuple[str, ...]) -> dict[str, Any]:
        if name in done:
            return done[name]
        if name in trail:
            raise ConfigError(f"{where}: profile bases form a cycle: {' → '.join((*trail, name))}")
        table = tables[name]
        if not isinstance(table, dict):
            return table  # not a table: left for validation to name
        own = dict(table)
        base = own.pop("base", None)
        if base is not None:
            if not isinstance(base, str):
                raise ConfigError(f"{where}: profile {name}'s base must be a profile's name, not {base!r}")
            if base not in tables or not isinstance(tables[base], dict):
                raise ConfigError(f"{where}: profile {name} has base '{base}', which is not a profile "
                                  f"here (profiles: {', '.join(sorted(tables))})")
            own = {**expand(base, (*trail, name)), **own}
        done[name] = own
        return own

    return {name: expand(name, ()) for name in tables}


# what only the generated task families read: refused where written in an experiment with a task_file,
# and shown as not used by `validate` where a default
GENERATED_ONLY = ("heldout_test_fraction", "profile.records")


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file the user wrote, refused in one line naming where it breaks: the file, line and column."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        m = re.fullmatch(r"(.*) \((?:at line (\d+), column (\d+)|(at end of document))\)", str(e), re.DOTALL)
        where = "" if m is None else " at the end of the file" if m[4] else f" at line {m[2]}, column {m[3]}"
        raise ConfigError(f"{path}: not valid TOML{where}: {m[1].lower() if m else e}") from None


def _once(errors: list[Any], written: Any) -> list[Any]:
    """The errors without those a profile repeats from its base (the same place, the same words): the
    base's own line says it, once, where it is to be mended."""
    def base(p: Any) -> Any:
        own = written.get(p) if isinstance(written, dict) else None
        return own.get("base") if isinstance(own, dict) else None

    seen = {(e["type"], e["msg"], e["loc"]) for e in errors}
    return [e for e in errors if not (len(e["loc"]) >= 2 and e["loc"][0] == "profiles" and (b := base(e["loc"][1]))
                                      and (e["type"], e["msg"], ("profiles", b, *e["loc"][2:])) in seen)]


def load_experiment(name: str, directory: Path | None = None) -> Experiment:
    d = directory or config_dir()
    path = d / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(
            f"unknown experiment '{name}' (known: {', '.join(experiment_names(d)) or 'none'}; "
            f"looked in {d})"
        )
    data = read_toml(path)
    written = data.get("profiles")  # as written, before bases are expanded
    if isinstance(written, dict):
        data["profiles"] = inherit_profiles(written, path)
    # the file's name is the experiment's: said with the rest of what is wrong, not alone first
    wrong = [] if not isinstance(data.get("name"), str) or data["name"] == name else [(
        f"name = {json.dumps(data['name'])}, and the file is {name}.toml: an experiment's file is named for it "
        f"(NAME.toml): rename the file to {data['name']}.toml, or set name = \"{name}\"")]
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as e:
        wrong += problems(_once(e.errors(), written), Experiment, data) or ["not a valid experiment"]
    if wrong:
        raise ConfigError("\n".join(f"{path}: {line}" for line in wrong))
    if exp.task_file is not None:  # what only the generated families use would be ignored: refused instead
        unused = [k for k in GENERATED_ONLY if "." not in k and k in data] + [
            f"profiles.{p}.{k.removeprefix('profile.')}" for k in GENERATED_ONLY if k.startswith("profile.")
            for p, t in (written or {}).items() if isinstance(t, dict) and k.removeprefix("profile.") in t]
        if unused:
            raise ConfigError(f"{path}: {', '.join(unused)} shape(s) the generated task families, and this "
                              f"experiment's cases come from its task_file {exp.task_file}: remove them")
    elif pinned := sorted(p for p, prof in exp.profiles.items() if prof.case_ids is not None):
        raise ConfigError(f"{path}: profile(s) {', '.join(pinned)} pin case_ids, and this experiment has no task_file: "
                          "the generated task families have no ids to pin — remove case_ids, or give a task_file")
    exp._directory = d
    return exp


def origins(name: str, profile: str, directory: Path | None = None) -> dict[str, tuple[Any, str]]:
    """Every value of `name` at `profile` with where it comes from ("experiment", "arm <a>", "profile
    <p>", "profile <b> (base of <p>)", "default"), keyed "key", "arms.<a>.<key>", "profile.<key>":
    what `orchestrate validate` shows, so that no value runs without its origin being visible.
    The study is resolved first: an invalid one is refused here as `resolve` refuses it."""
    r = resolve(name, profile, directory)
    d = directory or config_dir()
    raw = tomllib.loads((d / f"{name}.toml").read_text(encoding="utf-8"))
    tables = raw.get("profiles", {})
    out: dict[str, tuple[Any, str]] = {}
    for key, value in r.experiment.model_dump(mode="json", exclude={"arms", "profiles"}).items():
        if isinstance(value, dict):
            for k, v in value.items():
                out[f"{key}.{k}"] = (v, "experiment" if k in raw.get(key, {}) else "default")
        else:
            out[key] = (value, "experiment" if key in raw else "default")
    chain, at = [], profile
    while at is not None:
        chain.append(at)
        at = tables.get(at, {}).get("base")

    def written_in(k: str) -> str:
        where = next((p for p in chain if k in tables.get(p, {})), None)
        return "default" if where is None else f"profile {where}" + ("" if where == profile else f" (base of {profile})")

    scaled = {(a, k): own for a, k, own, _ in r.scaled()}
    for a, written in zip(r.experiment.arms, raw.get("arms", [])):
        for k, v in a.model_dump(mode="json").items():
            if k == "name":
                continue
            if (a.name, k) in scaled:
                out[f"arms.{a.name}.{k}"] = (getattr(r.profile, k), f"{written_in(k)}, replacing the arm's own {scaled[(a.name, k)]}")
            elif v is not None or k in written:
                out[f"arms.{a.name}.{k}"] = (v, f"arm {a.name}" if k in written else "default")
    for k, v in r.profile.model_dump(mode="json").items():
        out[f"profile.{k}"] = (v, written_in(k))
        if k == "checkpoint_every" and v is None and r.checkpoint_interval:  # what runs; the digest holds null
            out[f"profile.{k}"] = (r.checkpoint_interval, f"default: a checkpoint every {r.checkpoint_interval} of "
                                   f"the {r.profile.updates} updates (1/{DEFAULT_CHECKPOINTS} of them; not in the "
                                   "digest: set checkpoint_every to choose, 0 for none)")
        if k in out and v is not None:  # a profile's value of an experiment's key is the one that runs
            out[k] = (v, f"{written_in(k)}, replacing the experiment's {json.dumps(out[k][0])}")
    if r.experiment.task_file is not None:  # defaults only the generated families read (written, they are refused)
        for k in GENERATED_ONLY:
            v, o = out[k]
            out[k] = (v, f"{o}; not used: the cases come from task_file")
    return out


def resolve(name: str, profile: str, directory: Path | None = None) -> Resolved:
    exp = load_experiment(name, directory)
    if profile not in exp.profiles:
        raise ConfigError(
            f"experiment {name} has no profile '{profile}' (profiles: {', '.join(sorted(exp.profiles))})"
        )
    prof = exp.profiles[profile]
    r = Resolved(experiment=exp, profile_name=profile, profile=prof)
    total = prof.updates * r.global_batch
    if total % r.documents:
        raise ConfigError(
            f"{name}/{profile}: updates × global_batch = {total} is not a whole number of passes "
            f"over {r.documents} documents (tasks + replay)"
        )
    for a in exp.arms:
        if a.trains and r.global_batch % a.world_size:
            raise ConfigError(f"{name}/{profile}: global batch {r.global_batch} does not split "
                              f"over arm {a.name}'s {a.world_size} ranks")
    _check_scaled(r)
    return r


def _check_scaled(r: Resolved) -> None:
    """A profile's value for an arm setting (`sync_every`, `dense_warmup`) scales the experiment's one
    value of it with the profile's updates. Refused where it would not take effect as written: no arm
    takes it, the arms that take it hold different values of their own (one profile value would erase
    the difference the experiment compares), or the arm's kind refuses the value (H = 0)."""
    where = f"{r.experiment.name}/{r.profile_name}"
    for key in sorted({k for kd in KINDS.values() for k in kd.profile_scaled}):
        value = getattr(r.profile, key, None)
        if value is None:
            continue
        arms = [a for a in r.experiment.arms if key in arm_kind(a.kind).profile_scaled]
        if not arms:
            takers = sorted(kd.name for kd in KINDS.values() if key in kd.profile_scaled)
            raise ConfigError(f"{where}: profile sets {key} = {value}, but no arm of {r.experiment.name} "
                              f"takes it (only {', '.join(takers)} arms do): remove it from the profile")
        own = {a.name: getattr(a, key) for a in arms}
        if len(set(own.values())) > 1:
            raise ConfigError(f"{where}: profile sets {key} = {value}, which would replace each arm's own "
                              f"({', '.join(f'{n}: {v}' for n, v in own.items())}), and they differ: set "
                              f"{key} on each arm (a profile can scale only one shared value)")
        for a in arms:
            try:
                arm_kind(a.kind).settings_model(**{k: v for k, v in r.arm_settings(a).items() if v is not None})
            except ValidationError as e:
                bad = [err for err in e.errors() if err["loc"] and err["loc"][0] == key]
                if bad:
                    raise ConfigError(f"{where}: profile sets {key} = {value}, which arm {a.name} "
                                      f"({a.kind}) refuses: {bad[0]['msg']}") from None
    for a in r.experiment.arms:  # every arm's settings as its ranks will take them: refused now, not mid-trial
        if a.trains:
            try:
                arm_kind(a.kind).settings(r.arm_settings(a))
            except ValueError as e:
                raise ConfigError(f"{where}: arm {a.name}: {e}") from None


def lineage(name: str, profile: str, directory: Path | None = None) -> list[Resolved]:
    """`name` preceded by every experiment whose tasks it must not repeat, oldest first."""
    chain: list[Resolved] = []
    seen: set[str] = set()
    n: str | None = name
    while n:
        if n in seen:
            raise ConfigError(f"experiments' 'previous' links form a cycle through {n}")
        seen.add(n)
        if chain and profile not in (prev := load_experiment(n, directory)).profiles:
            after = chain[0].experiment.name
            raise ConfigError(
                f"{after}/{profile}: {after}'s tasks must not repeat those of {n} (its `previous`), which is "
                f"prepared first at the same profile, and {n} has no profile '{profile}' (profiles: "
                f"{', '.join(sorted(prev.profiles))}): add [profiles.{profile}] to {n}.toml too (`base = \"…\"` "
                "reuses one of its profiles), or run at a profile both have")
        r = resolve(n, profile, directory)
        chain.insert(0, r)
        n = r.experiment.previous
    return chain


def address(spec: str, directory: Path | None = None, *, judged: bool = False) -> tuple[str, str]:
    """(experiment, arm) for what a user names on the command line: `EXPERIMENT/ARM`, an experiment's
    name (its primary arm), or an arm name that one experiment alone has (`arm_to_experiment`).
    `judged`: the command runs every arm of the experiment and judges its primary (a trial), so any
    other arm is refused by name (`not_judged`) rather than run as the whole experiment under its name."""
    d = directory or config_dir()
    if "/" in spec:
        name, arm = spec.split("/", 1)
        exp = load_experiment(name, d)
        if arm not in {a.name for a in exp.arms}:
            raise ConfigError(f"experiment {name} has no arm '{arm}' (arms: {', '.join(a.name for a in exp.arms)})")
    elif spec in experiment_names(d):
        exp = load_experiment(spec, d)
        name, arm = spec, exp.acceptance.primary
    else:
        name, arm = arm_to_experiment(spec, d), spec
        exp = load_experiment(name, d)
    if judged and (why := not_judged(exp, arm)):
        primary = exp.acceptance.primary
        raise ConfigError(f"{why}: run `orchestrate run {name}` (or `orchestrate run {name}/{primary}`), which "
                          f"trains {arm} too")
    return name, arm


def not_judged(exp: Experiment, arm: str) -> str | None:
    """Why naming `arm` selects nothing of its own where a command judges the experiment: a trial trains
    every arm of it and judges its primary; None for the primary. One wording for every command that
    takes an arm and does not use it (`run` refuses with it, `gates` says it)."""
    primary = exp.acceptance.primary
    if arm == primary:
        return None
    return (f"arm {arm} is not the primary arm of {exp.name}: a trial runs every arm of {exp.name} "
            f"({', '.join(a.name for a in exp.arms)}) and judges its primary arm, {primary}")


def arm_to_experiment(arm: str, directory: Path | None = None) -> str:
    """The one experiment that has an arm named `arm`. A name that several experiments have is refused
    with each choice as EXPERIMENT/ARM, whichever of them is a primary: choosing for the user ran a study
    the user may not have meant, without a word. An experiment whose file is not valid counts where its
    arms cannot be read or include `arm`: that file is then named, not passed over."""
    d = directory or config_dir()
    hits, broken, known = [], [], []
    for n in experiment_names(d):
        try:
            names = [a.name for a in load_experiment(n, d).arms]
        except ConfigError as e:
            names = _written_arms(d / f"{n}.toml")
            if names is None or arm in names:
                broken.append((n, str(e).splitlines()[0], "may have" if names is None else "has"))
                continue
        known += names
        if arm in names:
            hits.append(n)
    too = " too" if hits else ""
    unsure = "; ".join(f"{n}.toml, which is not valid, {has} it{too} ({first})" for n, first, has in broken)
    if len(hits) > 1:
        raise ConfigError(f"arm '{arm}' is an arm of {len(hits)} experiments ({', '.join(hits)}): name one, as "
                          + " or ".join(f"{n}/{arm}" for n in hits) + (f"; and {unsure}" if broken else ""))
    if broken:
        fix = "fix that file" if len(broken) == 1 else "fix those files"
        raise ConfigError(f"arm '{arm}' is an arm of {hits[0]}, and {unsure}: {fix}, or name the arm as "
                          f"{hits[0]}/{arm}" if hits else
                          f"arm '{arm}': {unsure}: {fix}, or name the arm as EXPERIMENT/{arm}")
    if not hits:
        guess = difflib.get_close_matches(arm, sorted(set(known)) + experiment_names(d), n=1)
        raise ConfigError(f"no experiment has an arm or is named '{arm}'" + (f" (did you mean {guess[0]}?)" if guess
                          else "") + "; `orchestrate list` shows the experiments and their arms")
    return hits[0]


def _written_arms(path: Path) -> list[str] | None:
    """The arm names a file that is not a valid experiment writes, where they can be read at all."""
    try:
        arms = read_toml(path).get("arms", [])
    except (OSError, ConfigError):
        return None
    if not isinstance(arms, list) or not all(isinstance(a, dict) and isinstance(a.get("name"), str) for a in arms):
        return None
    return [a["name"] for a in arms]
