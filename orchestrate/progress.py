"""How a stage tells the person running it what it does: one small interface, handed to each stage.

Stages never reach for a console of their own: the CLI hands them its console, a benchmark its own,
and a caller that wants nothing on screen can hand them one that keeps quiet.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from typing import Any, Protocol

from rich.console import Console
from rich.text import Text


class Progress(Protocol):
    """A labelled line, a plain line, and a spinner over a long step."""

    def say(self, label: str, text: str, style: str = "bold") -> None: ...
    def line(self, text: str) -> None: ...
    def status(self, text: str) -> AbstractContextManager[Any]: ...


def stderr_console() -> Console:
    """The console the CLI and the benchmarks print progress on."""
    # logs and CI are not terminals: give tables room instead of rich's 80-column default. No markup:
    # messages, paths and patterns hold brackets that rich would take for tags (`[a-z0-9]` once vanished
    # from an error); a styled label is a Text (`say`). No wrapping of text: a long path stays whole
    return Console(stderr=True, width=None if sys.stderr.isatty() else 120, markup=False, soft_wrap=True)


class ConsoleProgress:
    """Progress on a rich console."""

    def __init__(self, console: Console):
        self.console = console

    def say(self, label: str, text: str, style: str = "bold") -> None:
        """One line: a styled label, then `text` exactly as given."""
        self.console.print(Text.assemble((label, style), " ", text), highlight=False)

    def line(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def status(self, text: str) -> AbstractContextManager[Any]:
        return self.console.status(text)
