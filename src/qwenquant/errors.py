"""The error types library code raises; the CLI turns them into one red line, a hint and an exit code."""

from __future__ import annotations


class QwenquantError(Exception):
    """An error a user can act on: `message` says what went wrong, `hint` what to do next."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(QwenquantError):
    """The command line asks for something that cannot be done (a bad value or combination of options)."""

    exit_code = 2


class FetchError(QwenquantError):
    """A download or a downloaded file could not be trusted."""

    exit_code = 3


class VerificationError(QwenquantError):
    """Bytes on disk do not match the record that describes them."""

    exit_code = 4


class RecipeError(QwenquantError):
    """A recipe file is invalid; `problems` lists every field path with its fix."""

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.problems = problems or []

    def __str__(self) -> str:
        if not self.problems:
            return self.message
        return self.message + "\n" + "\n".join(f"  - {p}" for p in self.problems)


class StageError(QwenquantError):
    """A pipeline stage failed."""

    exit_code = 5


class CheckError(QwenquantError):
    """An artifact would be refused by vLLM at load time."""

    exit_code = 6


class ServeError(QwenquantError):
    """The server could not be started, or stopped being healthy."""

    exit_code = 7


class OutFolderError(QwenquantError):
    """An output folder holds files qwenquant did not write; nothing was touched (pass --force)."""

    exit_code = 5


class BenchError(QwenquantError):
    """A benchmark or eval could not measure what it promises (no usage from the server, a failed
    request), or a quality gate failed."""

    exit_code = 8


def damaged_file_hint(folder: object) -> str:
    """The hint for a file of an artifact that cannot be read (plan, check and serve say the same)."""
    return f"the file is damaged: re-copy it; `qwenquant verify {folder}` lists every file that differs"
