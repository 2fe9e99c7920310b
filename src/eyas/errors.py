"""Errors a user can act on: the CLI prints each as one line and exits with its `exit_code`.

Exit codes, the same in every verb (docs/cli.md): 0 ok; 1 a check found problems (verify, audit,
preflight, check-draft, and a stage stopped by its own preflight); 2 bad input or usage; 3 this
environment cannot run it (an engine or package not installed, no such device)."""

from __future__ import annotations

from pathlib import Path


class EyasError(Exception):
    """A problem with the user's input, config or environment (not a bug in eyas)."""

    exit_code = 2


class ChecksFailed(EyasError):
    """A check (a preflight, a verification) found problems: exit code 1."""

    exit_code = 1


class CannotRun(EyasError):
    """This environment cannot run the command (a missing engine or package, no such device): exit code 3."""

    exit_code = 3


class DiskFull(EyasError):
    """The disk (or quota) filled up while writing `path`; `reason` is the OS's wording."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: disk full ({reason}) while writing it; free space and rerun the same command "
                         "to resume")


class UnreadableInput(EyasError):
    """An input file that cannot be read (permissions, I/O, encoding, truncation), with the reason."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: cannot read it: {reason}")


class InputError(EyasError):
    """Bad input data, located as `file:line: field: problem`."""

    def __init__(self, source: str, field: str, problem: str, reason: str | None = None) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        self.reason = reason or problem  # short fixed phrase used to count skipped records
        super().__init__(f"{source}: {field}: {problem}")


def where(path: Path | str, line: int | str) -> str:
    """Return the `file:line` location string used in every data error."""
    return f"{path}:{line}"
