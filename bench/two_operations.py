"""Two operations on one trial at once (#65, item 4), before and after the program's lease (infra/lease.py):

    python bench/two_operations.py [BEFORE_REV]     # default 61f09cb (#65 before the lease); ~1 min

Each case runs with the program of BEFORE_REV (a temporary `git worktree`, removed at the end) and with this
tree's, both under this tree's harness: a self-managed backend's checkpoint and lock files (tests/pulumi_engine.py
`DiyBackend`), `pulumi cancel` as that backend does it (the lock files deleted, nothing else), an operation held
mid-step by a `pause` fault while the second one runs, moto's EC2 and SSM as the account. Printed per step: the
command, its exit and the first words of what it said, live instances by tag against those in the checkpoint, what
a destroy deleted; at each case's end what is live and whether the trial's deadline stop is still in the stack.

  A  an `up` held at rank 3's create; `pulumi cancel`; `orchestrate destroy` (the trial preserved) beside it
  B  a destroy held at rank 0's delete; `pulumi cancel`; an `up` beside it
  C  a first `up` held at its VPC's create (no host yet); a second stack (another backend) `up`s the same trial
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for sub in ("tests", "tests/infra", "bench"):
    sys.path.insert(0, str(ROOT / sub))
sys.path.insert(0, str(ROOT))


def first_words(d, n: int = 140) -> str:
    from before_after import first_words as words

    return words(d, ("refusing", "the stack is currently locked"), n)


def main() -> None:
    from before_after import run_against

    run_against(run_cases, "61f09cb")


def run_cases(aws, before_rev: str) -> None:
    from before_after import before_tree

    with before_tree(before_rev, "two-ops-") as (before, tmp):
        from pulumi_engine import DiyBackend, pulumi_run, pulumi_start, teardown_env
        from test_destroy import moto_rules, terminate_trial
        from test_failures import preserve_into
        from test_infra import CALLS, live, stack_of

        ec2 = aws.client("ec2")
        host = "aws:ec2/instance:Instance"

        def tagged(trial: str) -> dict[str, str | None]:
            return {i["InstanceId"]: next((t["Value"] for t in i.get("Tags", []) if t["Key"] == "rank"), None)
                    for r in ec2.describe_instances(Filters=[{"Name": "tag:trial", "Values": [trial]}])["Reservations"]
                    for i in r["Instances"] if i["State"]["Name"] != "terminated"}

        def new_trial(case: str) -> tuple[str, str, dict]:
            """A trial of its own for a case: its name, its evidence bucket (made), its stack config."""
            t = f"two-{case}-{uuid.uuid4().hex[:5]}"
            aws.client("s3").create_bucket(Bucket=f"{t}-evidence")
            return t, f"{t}-evidence", stack_of(live(trial=t))

        def hosts_in(state: list[dict]) -> int:
            return sum(s["type"] == host and bool(s.get("id")) and not s.get("pending") for s in state)

        def wait_for(path: Path, running, hosts: int | None = None, backend=None) -> None:
            end = time.monotonic() + 120
            while not path.exists() or (hosts is not None and hosts_in(backend.read("test")) < hosts):
                if running.p.poll() is not None:
                    raise SystemExit(f"the held operation ended early: {first_words(running.wait())}")
                if time.monotonic() > end:
                    raise SystemExit(f"never reached {path.name}")
                time.sleep(0.1)

        for label, root in (("before", before), ("after", ROOT)):
            print(f"\n=== {label}: the program at {before_rev if label == 'before' else 'this tree'} ===")

            def row(step: str, d, trial: str, backend=None) -> None:
                gone = [st["name"] for st in d.steps if st["custom"] and st["outcome"].startswith("deleted")]
                state = backend.read("test") if backend is not None else d.state
                print(f"  {step:<44} exit {d.returncode:>3}  {len(tagged(trial))} live by tag, {hosts_in(state)} in the "
                      f"checkpoint, {len(gone)} deleted{' (the deadline stop among them)' if f'{trial}-deadline' in gone else ''}"
                      f"  | {first_words(d)}")

            def end(trial: str, backend) -> None:
                state = backend.read("test")
                stop = any(s["name"] == f"{trial}-deadline" for s in state)
                live_ids = tagged(trial)
                print(f"  -> at the end: {len(live_ids)} instance(s) live, {hosts_in(state)} in the checkpoint; the deadline "
                      f"stop {'in' if stop else 'NOT in'} the checkpoint"
                      + (f" (it was deleted: {len(live_ids)} live instance(s) without their stop)" if live_ids and deleted_stop[0] else ""))

            deleted_stop = [False]

            # A -------------------------------------------------------------------------------------------------
            t, bucket, config = new_trial("a")
            preserve_into(aws, bucket, t, tmp / f"{label}-a")
            backend = DiyBackend(tmp / f"{label}-a-backend")
            kw = {"root": root, "answers": moto_rules(bucket, t), "calls": CALLS, "provider": "moto", "backend": backend}
            print("A  an up held at rank 3's create; pulumi cancel; orchestrate destroy beside it (preserved)")
            pause = tmp / f"{label}-a-pause"
            up = pulumi_start("up", config, faults=[{"name": f"{t}-rank-3", "type": host, "op": "create",
                                                     "pause": str(pause)}], **kw)
            wait_for(Path(f"{pause}.reached"), up, 3, backend)
            row("destroy while the up holds the lock", pulumi_run("destroy", config, env=teardown_env(), **kw), t, backend)
            print(f"  pulumi cancel: {backend.cancel('test')} lock file(s) deleted; the up runs on")
            d = pulumi_run("destroy", config, env=teardown_env(), **kw)
            deleted_stop[0] = any(st["name"] == f"{t}-deadline" and st["outcome"].startswith("deleted") for st in d.steps)
            row("destroy beside the running up", d, t, backend)
            pause.touch()
            row("the up, let go on", up.wait(), t, backend)
            end(t, backend)
            terminate_trial(aws, t)

            # B -------------------------------------------------------------------------------------------------
            deleted_stop[0] = False
            t, bucket, config = new_trial("b")
            backend = DiyBackend(tmp / f"{label}-b-backend")
            kw = {"root": root, "answers": moto_rules(bucket, t), "calls": CALLS, "provider": "moto", "backend": backend}
            print("B  a destroy held at rank 0's delete; pulumi cancel; an up beside it")
            row("up", pulumi_run("up", config, **kw), t, backend)
            preserve_into(aws, bucket, t, tmp / f"{label}-b")
            pause = tmp / f"{label}-b-pause"
            destroy = pulumi_start("destroy", config, env=teardown_env(), faults=[
                {"name": f"{t}-rank-0", "type": host, "op": "delete", "pause": str(pause)}], **kw)
            wait_for(Path(f"{pause}.reached"), destroy)
            print(f"  pulumi cancel: {backend.cancel('test')} lock file(s) deleted; the destroy runs on")
            row("up beside the running destroy", pulumi_run("up", config, **kw), t, backend)
            pause.touch()
            d = destroy.wait()
            deleted_stop[0] = any(st["name"] == f"{t}-deadline" and st["outcome"].startswith("deleted") for st in d.steps)
            row("the destroy, let go on", d, t, backend)
            end(t, backend)
            terminate_trial(aws, t)

            # C -------------------------------------------------------------------------------------------------
            deleted_stop[0] = False
            t, bucket, config = new_trial("c")
            mine, theirs = DiyBackend(tmp / f"{label}-c-mine"), DiyBackend(tmp / f"{label}-c-theirs")
            kw = {"root": root, "answers": moto_rules(bucket, t), "calls": CALLS, "provider": "moto"}
            print("C  a first up held at its VPC's create (no host yet); a second stack (another backend) ups the same trial")
            pause = tmp / f"{label}-c-pause"
            up = pulumi_start("up", config, backend=mine, faults=[{"name": f"{t}-vpc", "type": "aws:ec2/vpc:Vpc",
                                                                   "op": "create", "pause": str(pause)}], **kw)
            wait_for(Path(f"{pause}.reached"), up)
            other = pulumi_run("up", config, stack="colleague", backend=theirs, **kw)
            print(f"  {'the second stack up':<44} exit {other.returncode:>3}  {len(tagged(t))} live by tag, "
                  f"{hosts_in(theirs.read('colleague'))} in its checkpoint  | {first_words(other)}")
            pause.touch()
            first = up.wait()
            print(f"  {'the first up, let go on':<44} exit {first.returncode:>3}  {len(tagged(t))} live by tag, "
                  f"{hosts_in(mine.read('test'))} + {hosts_in(theirs.read('colleague'))} in the two checkpoints")
            terminate_trial(aws, t)


if __name__ == "__main__":
    main()
