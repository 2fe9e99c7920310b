"""Rich progress bars shared by the stages (records or samples, tokens/s, ETA) on stderr."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

stderr_console = Console(stderr=True)


def stage_progress() -> Progress:
    """Return a progress display with a `rate` field for a task (e.g. "12,345 tok/s").

    Shown only when stderr is a terminal, so logs and captured output hold results and errors only.
    """
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=stderr_console,
        transient=False,
        disable=not stderr_console.is_terminal,
    )
