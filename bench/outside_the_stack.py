"""Issue #65's cases, before and after, through the whole engine harness against moto (tests/pulumi_engine.py):

    python bench/outside_the_stack.py [BEFORE_REV]     # default 2a0edbf (the tree before #65); ~2 min

Each case runs twice: with the program of BEFORE_REV (a temporary `git worktree`, removed at the end) and with
this tree's, both under this tree's harness (which emulates an interrupted `up`'s pending create and answers the
program's instance look-ups from moto). The teardown is asked for as each tree asks for it: `TRIALS_TEARDOWN=1`
before, a request `orchestrate destroy` writes (infra/destroy_request.py) after. Printed per step: the command,
its exit and what the program or engine said (first words), live instances by tag against those in the state, what
a destroy deleted; and at each case's end what is still live. Uses a moto server of its own on loopback.
"""

from __future__ import annotations

import copy
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for sub in ("tests", "tests/infra", "bench"):
    sys.path.insert(0, str(ROOT / sub))
sys.path.insert(0, str(ROOT))


def first_words(d, n: int = 150) -> str:
    from before_after import first_words as words

    return words(d, ("refusing", "instance(s) of trial", "rank 3 has", "hook \""), n)


def main() -> None:
    from before_after import run_against

    run_against(run_cases, "2a0edbf")


def run_cases(aws, before_rev: str) -> None:
    from before_after import before_tree

    with before_tree(before_rev, "outside-") as (before, tmp):
        from pulumi_engine import pulumi_run, teardown_env
        from test_destroy import moto_rules, terminate_trial
        from test_failures import preserve_into
        from test_infra import CALLS, live, stack_of

        ec2 = aws.client("ec2")

        def tagged(trial: str) -> dict[str, str | None]:
            return {i["InstanceId"]: next((t["Value"] for t in i.get("Tags", []) if t["Key"] == "rank"), None)
                    for r in ec2.describe_instances(Filters=[{"Name": "tag:trial", "Values": [trial]}])["Reservations"]
                    for i in r["Instances"] if i["State"]["Name"] != "terminated"}

        def in_state(state: list[dict]) -> int:
            return sum(s["type"] == "aws:ec2/instance:Instance" and bool(s.get("id")) and not s.get("pending")
                       for s in state)

        for label, root in (("before", before), ("after", ROOT)):
            old = not (root / "infra" / "destroy_request.py").exists()

            def teardown() -> dict[str, str]:
                return {"TRIALS_TEARDOWN": "1"} if old else teardown_env()

            def run(op: str, config: dict, **kw):
                return pulumi_run(op, config, root=root, calls=CALLS, provider="moto", **kw)

            def row(step: str, d, trial: str, state: list[dict] | None = None) -> None:
                gone = [st for st in d.steps if st["custom"] and st["outcome"].startswith("deleted")]
                print(f"  {label:6} | {step:44} | exit {d.returncode:3} | {len(tagged(trial))} live by tag, "
                      f"{in_state(state if state is not None else d.state)} in the state | deleted {len(gone):2} | "
                      f"{first_words(d)}", flush=True)

            # 1. an interrupted up, the next ups, destroys before and after preservation
            T = f"ob-{label[:2]}-{uuid.uuid4().hex[:5]}"
            bucket = f"{T}-evidence"
            aws.client("s3").create_bucket(Bucket=bucket)
            rules = moto_rules(bucket, T)
            config = stack_of(live(trial=T))
            print(f"\n[1 interrupted up] {label} ({root.name if old else 'this tree'}), trial {T}")
            d = run("up", config, answers=rules, faults=[{"name": f"{T}-rank-3", "op": "create", "interrupt": True}])
            row("up (engine gone while creating rank 3)", d, T)
            d = run("up", config, answers=rules, state=d.state)
            row("up again (pending create warned of)", d, T)
            state = d.state
            d = run("up", config, answers=rules, state=state)
            row("up a third time", d, T, state)
            d = run("destroy", config, answers=rules, state=state, env=teardown())
            row("destroy, unpreserved", d, T)
            with tempfile.TemporaryDirectory() as t:
                preserve_into(aws, bucket, T, Path(t))
            d = run("destroy", config, answers=rules, state=state, env=teardown())
            row("destroy, preserved", d, T)
            if d.failed:  # refused: end what the refusal names (the instance outside the stack), destroy again
                held = {s["id"] for s in state if s.get("id")}
                outside = sorted(i for i in tagged(T) if i not in held)
                ec2.terminate_instances(InstanceIds=outside)
                d = run("destroy", config, answers=rules, state=state, env=teardown())
                row(f"terminate {len(outside)} outside, destroy", d, T)
            print(f"  {label:6} | left live: {len(tagged(T))} {sorted(tagged(T))}, tracked by no stack (the state is "
                  f"{'gone' if d.failed is None else 'kept'})")
            terminate_trial(aws, T)

            # 2. the trial renamed on a live stack
            T = f"oc-{label[:2]}-{uuid.uuid4().hex[:5]}"
            B = f"{T}-b"
            cluster = live(trial=T)
            print(f"\n[2 renamed trial] {label}, trial {T} -> {B}")
            up = run("up", stack_of(cluster), answers=moto_rules(f"{T}-evidence", T))
            row("up", up, T)
            renamed = {**copy.deepcopy(cluster), "trial": B}
            d = run("up", stack_of(renamed), answers=moto_rules(f"{B}-evidence", B), state=up.state)
            row(f"up as {B}", d, T)
            print(f"  {label:6} | live by tag: {T} {len(tagged(T))}, {B} {len(tagged(B))}")
            for name in (T, B):
                aws.client("s3").create_bucket(Bucket=f"{name}-evidence")
                with tempfile.TemporaryDirectory() as t:
                    preserve_into(aws, f"{name}-evidence", name, Path(t))
            d2 = run("destroy", stack_of(renamed), answers=moto_rules(f"{B}-evidence", B), state=d.state, env=teardown())
            row(f"destroy as {B}, both preserved", d2, B, d.state)
            print(f"  {label:6} | left live: {T} {len(tagged(T))}, {B} {len(tagged(B))}")
            terminate_trial(aws, T)
            terminate_trial(aws, B)

            # 3. two stacks, one trial name
            T = f"od-{label[:2]}-{uuid.uuid4().hex[:5]}"
            print(f"\n[3 two stacks, one trial] {label}, trial {T}")
            rules = moto_rules(f"{T}-evidence", T)
            d1 = pulumi_run("up", stack_of(live(trial=T)), root=root, calls=CALLS, provider="moto", answers=rules,
                            stack="first")
            row("stack first: up", d1, T)
            d2 = pulumi_run("up", stack_of(live(trial=T)), root=root, calls=CALLS, provider="moto", answers=rules,
                            stack="second")
            row("stack second: up, same trial", d2, T)
            terminate_trial(aws, T)

            # 4. TRIALS_TEARDOWN=1 left in the shell during an up that resizes a host
            T = f"oe-{label[:2]}-{uuid.uuid4().hex[:5]}"
            print(f"\n[4 teardown setting left set] {label}, trial {T}")
            rules = moto_rules(f"{T}-evidence", T)
            cluster = live(trial=T)
            up = run("up", stack_of(cluster), answers=rules)
            resized = copy.deepcopy(cluster)
            resized["hosts"][3]["instance_type"] = "g6e.2xlarge"
            resized["prices"] = {"instance/g6e.2xlarge": 2.24}
            resized["budget"] = {**resized["budget"], "compute_usd": 30, "total_usd": 106}
            d = run("up", stack_of(resized), answers=rules, state=up.state, env={"TRIALS_TEARDOWN": "1"})
            restarts = [o for o in d.ops if o.get("stops_and_starts")]
            row("up, resize rank 3, TRIALS_TEARDOWN=1", d, T)
            print(f"  {label:6} | hosts stopped and started: {[o['name'] for o in restarts]}")
            terminate_trial(aws, T)


if __name__ == "__main__":
    main()
