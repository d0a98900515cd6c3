"""The one console every command prints on (stderr: stdout is for `--json` and the figures a script reads)."""

from orchestrate.progress import ConsoleProgress, stderr_console

con = stderr_console()
progress = ConsoleProgress(con)
say = progress.say
