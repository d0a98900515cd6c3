"""`preserve` and `remove`: a home's evidence into its store, and a preserved home off this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from evidence.errors import UserError
from evidence.stores import FileStore, known_forms
from orchestrate.cli.console import con, progress, refusing, say


def preserve(home: Path = typer.Option(..., help="the trial home"),
             store: Optional[str] = typer.Option(None, help=f"one of {known_forms()} "
                                                            "(default: the cluster's, else file://<home's parent>/store)"),
             cluster: Optional[Path] = typer.Option(None, help="the cluster the ranks ran on: each SSH host "
                                                               "preserves the checkpoint payloads that stayed on it"),
             leave_host_payloads: Optional[str] = typer.Option(None, help="REASON: preserve without the payloads "
                                                               "that stayed on the hosts (recorded in the index)")) -> None:
    """Upload every file of the home, content-addressed, each object read back and re-hashed; with
    --cluster, every SSH host preserves its own checkpoint payloads from where they are."""
    from orchestrate.backends.ssh import SshHostParts
    from orchestrate.cluster import load
    from orchestrate.stages.preserve import preserve_home
    from training.hold import hold


    hosts = None
    try:
        desc = load(cluster) if cluster else None
        if desc is not None and leave_host_payloads is None:
            from orchestrate.cloud import hosts_not_running, start_command
            from orchestrate.homes import Refused

            try:
                down = hosts_not_running(desc)
            except Exception as e:  # noqa: BLE001 - no credentials, no endpoint: the hosts will say for themselves
                down = []
                say("warning:", f"could not ask EC2 whether the hosts run ({type(e).__name__}: {e}); trying them",
                    style="bold yellow")
            if down:
                raise Refused(f"not running: {', '.join(down)} — their payloads cannot be preserved from there. Start "
                              f"the stopped ones: {start_command(desc, str(cluster), str(home))} (a pending one is "
                              "starting: run again in a minute); or preserve without them, saying why "
                              "(--leave-host-payloads REASON)")
        if desc is not None and any(h.transport == "ssh" for h in desc.hosts):
            hosts = SshHostParts(desc, say=lambda m: say("preserve", m))
        url = store or (desc.store if desc else FileStore.url_for(home.resolve().parent / 'store'))
        with hold(home, f"trial home {home}"):
            rec = preserve_home(home, url, progress, hosts, leave_host_payloads)
    except UserError as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    finally:
        if hosts is not None:
            hosts.close()
    con.print(f"  → {rec.store}{rec.index}", highlight=False)


def remove(home: Path = typer.Option(..., help="the trial home to delete from this machine"),
           unpreserved: bool = typer.Option(False, "--unpreserved", help="discard a home that was never preserved "
                                            "(a failed run) and release its trial name in the store for a new run"),
           store: Optional[str] = typer.Option(None, help=f"with --unpreserved: the store its anchors are in, one of "
                                               f"{known_forms()} (default: file://<home's parent>/store, as "
                                               "`orchestrate run` without --store or --cluster)"),
           yes: bool = typer.Option(False, "--yes", "-y", help="with --unpreserved: delete without asking (what "
                                    "goes is still said first); needed where no one can answer (a script)")) -> None:
    """Delete a trial home once every file in it is in its preserved, verified evidence index: how old
    trials leave the disk. A home never preserved, whose store does not verify, or holding anything the
    index does not hold as it is now (a later run's report, a changed file) is refused, naming it, and
    left as it is. The store is not touched.

    With --unpreserved: delete a home that was never preserved (a run that failed after prepare, a task
    file changed since) and release its anchors in the store — kept there, with a release record — so
    that its name can be used again. Says what goes, then asks (--yes: does not ask). Where the store
    holds a preservation of that trial name, the home goes but nothing is released: the name stays
    taken there. A preserved home, a home a run holds, or a path that is no trial home is refused, and
    nothing is changed."""
    from orchestrate.homes import Kept, Refused, default_store, discard_home, remove_home

    if not unpreserved:
        for given, flag in ((store is not None, f"--store {store}"), (yes, "--yes")):
            if given:  # plain `remove` reads the store preserved.json names, and asks nothing: never silently ignored
                say("error:", f"{flag} is used only with --unpreserved (`remove` alone verifies the home against "
                    "the store its preserved.json names, and deletes only what that store holds)", style="bold red")
                raise typer.Exit(2)
        with refusing(Refused, label="refused:"), refusing(OSError):  # a disk failing part way: `remove` again
            r = remove_home(home, progress)
        say("removed", f"{home}: {r.files} files, {r.bytes / 1e6:,.1f} MB; every one is in {r.index} "
            f"({r.objects} objects verified)")
        return

    def confirm() -> bool:
        """Yes to deleting what was just said: --yes, or an answer on stdin; no answer (no terminal, an
        empty stdin) is refused, saying how to answer."""
        if yes:
            return True
        try:
            return typer.confirm("delete?", default=False, err=True)
        except typer.Abort:  # end of input (or Ctrl-C): nobody there to answer
            typer.echo(err=True)  # the prompt's line ends
            raise Refused(f"{home} not deleted: no answer on stdin — pass --yes to delete without asking") from None

    with refusing(Refused, label="refused:"), refusing(OSError):  # part way: `remove --unpreserved` again
        try:
            d = discard_home(home, store or default_store(home), progress, confirm)
        except Kept as e:  # the user said no: not an error, but not done either
            say("kept", str(e))
            raise typer.Exit(1) from None
    say("discarded", f"{home}: {d.files} files, {d.bytes / 1e6:,.1f} MB deleted; "
        + (f"released in {d.store}: {', '.join(d.released)} — the name may be run again" if d.released else
           f"nothing released — the name stays taken in {d.store} (a preservation of it is there: {d.taken_by}); "
           "run the study again in a new trials folder (`orchestrate run … --trials OTHER`: a store of its own), "
           "with another store (`--store URL`), or under a new name" if d.taken_by else
           "nothing to release — the name may be run again"))
