"""The one console every command prints on (stderr: stdout is for `--json` and the figures a script reads)."""

from contextlib import contextmanager
from typing import Iterator

import typer

from orchestrate.progress import ConsoleProgress, stderr_console

con = stderr_console()
progress = ConsoleProgress(con)
say = progress.say


@contextmanager
def refusing(*errors: type[BaseException], label: str = "error:") -> Iterator[None]:
    """How a command ends on a refusal it expects (`errors`): the message alone, in red, after `label`,
    and exit status 2 — never a traceback for something the user can mend."""
    try:
        yield
    except errors as e:
        say(label, str(e), style="bold red")
        raise typer.Exit(2) from None
