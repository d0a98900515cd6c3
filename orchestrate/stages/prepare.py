"""seed → prepare → commit: the seed model materialized (or verified), and every experiment of the
chain prepared in its own home, its receipts committed and anchored before anything trains."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from evidence.canonical import canonical_sha256, file_sha256
from evidence.receipts import RECEIPT_NAME
from orchestrate.progress import Progress
from orchestrate.stages.preserve import anchor_home
from training.prepare import prepare_chain
from training.sources import drawn
from training.seed import SeedError, import_files, materialize, verify_seed

if TYPE_CHECKING:
    from training.config import Resolved


def materialize_seed(cfg: Resolved, seeds: Path, progress: Progress) -> Path:
    """The profile's seed under `seeds`, materialized once and verified on every later run."""

    md = seeds / cfg.profile.seed
    progress.say("seed", f"{cfg.profile.seed} → {md}")
    with progress.status("materializing / verifying the seed…"):
        materialize(cfg.profile.seed, md, say=lambda m: progress.say("seed", m))
    return md


def seed_from_model_dir(model_dir: Path, seeds: Path, progress: Progress) -> Path:
    """The seed `--model-dir` names. A seed directory made by `python -m training seed` (it holds its
    receipt) is verified and used where it is; any other Hugging Face directory is imported once, with
    a receipt, under `seeds/local-<its content digest>`: a directory whose files change later is
    another seed, never the copy of the old one."""

    if not model_dir.is_dir():
        raise SeedError(f"--model-dir {model_dir} is not a directory")
    if (model_dir / RECEIPT_NAME).is_file():
        verify_seed(model_dir)
        return model_dir
    with progress.status(f"hashing {model_dir}…"):  # the files an import copies
        table = {p.name: file_sha256(p) for p in import_files(model_dir)}
    out = seeds / f"local-{canonical_sha256(table)[:16]}"
    progress.say("seed", f"{model_dir} → {out}" + (" (imported before: verified)" if out.exists() else " (imported, with a receipt)"))
    with progress.status("importing / verifying the seed…"):
        receipt = materialize("local", out, source=str(model_dir), say=lambda m: progress.say("seed", m))
    if {k: v["sha256"] for k, v in receipt["files"].items()} != table:  # the name must say what it holds
        raise SeedError(f"{out} does not hold the files {model_dir} had when it was hashed (did they change while "
                        f"it was imported?): remove {out} and run again")
    return out


def prepare(cfg: Resolved, chain: list[Resolved], home_of: Callable[[Resolved], Path], seed_dir: Path,
            store_url: str, progress: Progress, *, replay_file: Path | None = None) -> Iterator[Path]:
    """Each experiment of `chain` (earlier experiments first: none of their tasks may recur) prepared
    in its home and anchored in the store. Yields each home as it is prepared, so a run that fails at
    a later experiment still knows — and records — the last home it reached."""

    name, profile = cfg.experiment.name, cfg.profile_name
    doing = f"preparing {name}" + (" and the experiments before it…" if cfg.experiment.previous else "…")
    with progress.status(doing):
        for step, home, res in prepare_chain(chain, home_of, seed_dir,
                                             replay_file=str(replay_file) if replay_file else None):
            yield home
            anchor_home(home, store_url, progress)
            c = res["prepared"]["counts"]
            progress.say("prepare", f"{step.experiment.name}/{profile} → {home}"
                         + (f" (no task of {step.experiment.previous} recurs)" if step.experiment.previous else "")
                         + f": {res['status']} in {res['record']['seconds']['total']:.1f} s: "
                         f"{c['task']['documents']} task + {c['replay']['documents']} replay documents, "
                         f"task share of targets {c['task_share_of_targets']:.1%} unweighted / "
                         f"{c['task_share_of_weighted_targets']:.1%} weighted; committed")
            ts = res["prepared"].get("task_source")
            if ts is not None:
                u = ts["used"]
                progress.say("prepare", f"  tasks: {ts['file']} (sha256 {ts['sha256'][:12]}…): train {u['train']}, "
                             f"dev {u['dev']}, test {u['test']} of its {ts['cases']} cases ({ts['unused']} not used); "
                             f"{res['prepared']['corruption']['count']} damaged targets from its wrong answers")
                progress.say("prepare", f"  {drawn(ts)}")
            for w in res["warnings"]:
                progress.say("warning", w, style="bold yellow")
            src = res["prepared"].get("replay_source") or {}
            if src.get("kind") == "user-jsonl":
                progress.say("prepare", f"  replay: {src['rows']} conversations from {src['file']} (sha256 {src['sha256'][:12]}…)")
            for arm, key, own, value in step.scaled():  # the arm's own value does not run: say so
                progress.say("prepare", f"  {arm}: {key} = {value} (profile {profile}; the arm's own: {own})")
