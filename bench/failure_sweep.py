"""Every failure point of the four-host program through the whole engine harness (#54), against moto:

    python bench/failure_sweep.py [cancel|drain ...]    # both by default; about 4 s a harness run
    python bench/failure_sweep.py --hosts 32 --stops     # 32 hosts: the deadline stop, budgets, spend stops (#68)

For each of the program's creates in turn: `pulumi up` with that create refused by the provider
(InsufficientInstanceCapacity's words), the engine stopping at once ("cancel") or letting every independent
step finish ("drain"); what it left (resources, hosts) and which stops cover each host; then
the teardown `orchestrate destroy` runs (`pulumi destroy --run-program`) of that state before preservation (its hooks over gRPC
against moto's EC2 and S3), and after it. Each answer is compared with the in-process walk of
tests/infra/test_failures.py (`destroy_here`) on the same state; a difference is printed and counted.
Prints one row per point, then the totals. Uses a moto server on loopback of its own; touches nothing else.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for sub in ("tests", "tests/infra"):
    sys.path.insert(0, str(ROOT / sub))
sys.path.insert(0, str(ROOT))


def main() -> None:
    import boto3

    from local_moto import local_moto

    with local_moto():
        from infra.teardown import DeleteCheck
        from pulumi_engine import pulumi_run
        from test_destroy import TEARDOWN, live_instances, moto_rules, terminate_trial
        from test_failures import CAPACITY, HOST, TRIAL, coverage, destroy_here, in_account, preserve_into
        from test_infra import CALLS, answers, live, stack_of

        from infra.plan import TrialConfig

        from test_many_hosts import big

        args = sys.argv[1:]
        hosts = 4
        if "--hosts" in args:
            i = args.index("--hosts")
            hosts = int(args[i + 1])
            del args[i:i + 2]
        stops_only = "--stops" in args
        if stops_only:
            args.remove("--stops")
        aws = boto3.Session(region_name="us-east-1")
        cluster = live() if hosts == 4 else big(hosts, trial=TRIAL)
        config, cfg = stack_of(cluster), TrialConfig.model_validate(cluster)
        teardown = pulumi_run("destroy", config, state=[], answers=answers(TRIAL, hosts), calls=CALLS,
                              env=TEARDOWN).record["engine_states"]
        baseline = pulumi_run("up", config, answers=answers(TRIAL, hosts), calls=CALLS)
        points = [(s["name"], s["type"]) for s in in_account(baseline.record["engine_states"])]
        if stops_only:  # what #68 changed: the deadline stop's schedule, the budgets and every host's spend stop
            points = [(n, t) for n, t in points if t in ("aws:scheduler/schedule:Schedule", "aws:budgets/budget:Budget",
                                                         "aws:budgets/budgetAction:BudgetAction")]
        print(f"{hosts} hosts, {len(points)} failure points{' (the deadline stop, the budgets, the spend stops)' if stops_only else ''}")
        modes = args or ["cancel", "drain"]
        mismatches = 0
        for mode in modes:
            print(f"\n{mode}: create fails at | exist (hosts) | deadline stop | transfer alarms (isolated) | "
                  "spend stops | destroy before preservation: deleted | after: deleted, kept | s")
            totals = {"points": 0, "with_hosts": 0, "deleted_before_with_hosts": 0, "uncovered": 0}
            for name, typ in points:
                t0 = time.perf_counter()
                bucket = f"sweep-{uuid.uuid4().hex[:10]}"
                rules = moto_rules(bucket)
                up = pulumi_run("up", config, answers=rules, calls=CALLS, provider="moto",
                                faults=[{"name": name, "type": typ, "op": "create", "error": CAPACITY}],
                                after_failure=mode)
                state = up.state
                cov = coverage(state, cfg)
                hosts = sum(s["type"] == HOST for s in state)
                n = len(in_account(state))

                def destroy() -> tuple[set[str], int, str | None]:
                    """The teardown of `state` (`pulumi destroy --run-program`): deleted urns, kept, error."""
                    d = pulumi_run("destroy", config, state=state, answers=rules, calls=CALLS, env=TEARDOWN,
                                   provider="moto")
                    done = {st["urn"] for st in in_account(d.steps)
                            if st["outcome"] not in ("failed", "not started", "retained")}
                    return done, sum(st["outcome"] == "retained" for st in in_account(d.steps)), d.failed

                notes = []
                done, _, error = destroy()
                before = f"{len(done):2}{' refused' if error else ''}"
                after = "-"  # no host: the destroy went through; nothing is left for an "after"
                if hosts:
                    totals["deleted_before_with_hosts"] += len(done)
                    if error is not None:  # the in-process walk on the same state, the hosts live and unpreserved
                        check = DeleteCheck(TRIAL, False, lambda: aws, dry_run=False)
                        check.hold({s["id"] for s in state if s["type"] == HOST})  # the hosts the state holds
                        here = destroy_here(state, teardown, check)
                        if {st["urn"] for st in here[0] if st["outcome"] == "deleted"} != done or here[1] is None:
                            notes.append("walk differs")
                    with tempfile.TemporaryDirectory() as tmp:
                        preserve_into(aws, bucket, TRIAL, Path(tmp))
                    done, kept, error = destroy()
                    after = f"{len(done)}, {kept}{' FAILED' if error else ''}"
                terminate_trial(aws)
                iso = [c for c in cov if c["transfer"] is not None]
                uncovered = sum(not c["deadline"] for c in cov)
                totals["points"] += 1
                totals["with_hosts"] += bool(hosts)
                totals["uncovered"] += uncovered
                mismatches += len(notes)
                print(f"  {typ.split(':')[-1] + ' ' + name:52} {n:3} ({hosts}) | {len(cov) - uncovered}/{len(cov)} | "
                      f"{sum(bool(c['transfer']) for c in iso)}/{len(iso)} | {sum(c['spend'] for c in cov)}/{len(cov)} | "
                      f"{before} | {after} | {time.perf_counter() - t0:4.1f}{'  ' + ', '.join(notes) if notes else ''}",
                      flush=True)
                assert live_instances(aws) == 0
            print(f"{mode}: {totals['points']} failure points, {totals['with_hosts']} leaving a host; hosts without "
                  f"the deadline stop: {totals['uncovered']}; resources a destroy deleted before preservation where "
                  f"a host existed: {totals['deleted_before_with_hosts']}")
        print(f"in-process walk vs the harness: {mismatches} difference(s)")


if __name__ == "__main__":
    main()
