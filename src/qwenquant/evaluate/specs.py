"""What `eval served` reads from JSON files, typed: the exact-match gate (a shipped name or the user's file), the
shipped tool-calling cases (`--tools`) and the needle task (`--needle`). Pydantic, frozen, strict (a number in
quotes is refused). `read_spec` reads one file: a file that is not JSON or whose field is not the spec's is a
UsageError (exit 2) of one line naming the file and the field. A tool's `parameters` stay a JSON schema (any
JSON object: evaluate/tools.py checks arguments against it)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qwenquant.errors import UsageError

GATE_HINT = (
    'a gate is {"name", "tasks": [{"name", "cases": [{"prompt", "expect"}], "max_tokens"?, "min_pass"?}], '
    '"acceptance_runs"?: [{"prompt"}]}; see the shipped tiny-reference gate'
)
TASK_SET_HINT = "the shipped task set is damaged: reinstall qwenquant"


class _Spec(BaseModel):
    """A shipped spec: every key named here, none other."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object as the file gave it (keys it lacked stay out)."""
        return self.model_dump(mode="json", exclude_unset=True)


class _GateSpec(_Spec):
    """A part of a gate, which may be the user's file: keys it does not name are notes (the shipped gate's
    `acceptance_runs_note`), ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class GateCase(_GateSpec):
    """One exact-match case: greedy text from `prompt` must start with `expect`."""

    prompt: str
    expect: str
    max_tokens: int | None = Field(None, ge=1)  # the task's when absent


class GateTask(_GateSpec):
    name: str
    cases: list[GateCase] = Field(min_length=1)
    max_tokens: int = Field(16, ge=1)
    min_pass: int | None = Field(None, ge=0)  # every case when absent

    @property
    def needs(self) -> int:
        """How many cases must pass."""
        return len(self.cases) if self.min_pass is None else self.min_pass


class AcceptanceRun(_GateSpec):
    """A longer greedy generation sent only to give MTP drafts to measure."""

    prompt: str
    max_tokens: int = Field(64, ge=1)


class Gate(_GateSpec):
    """An exact-match gate (`none`: no tasks)."""

    name: str | None = None
    description: str = ""
    tasks: list[GateTask]
    acceptance_runs: list[AcceptanceRun] = []


NO_GATE = Gate(name="none", tasks=[])


class ChatMessage(_Spec):
    role: Literal["system", "user", "assistant"]
    content: str


class ToolFunction(_Spec):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema: any JSON object


class ToolDef(_Spec):
    type: Literal["function"]
    function: ToolFunction


class NamedFunction(_Spec):
    name: str


class NamedChoice(_Spec):
    """`tool_choice` naming one function."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["auto", "required", "none"] | NamedChoice


class ToolCaseSpec(_Spec):
    """One tool-calling case: the chat, the tools sent, OpenAI's `tool_choice`."""

    name: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] = Field(min_length=1)
    tool_choice: ToolChoice = "auto"
    max_tokens: int | None = Field(None, ge=1)  # the set's when absent


class ToolsSpec(_Spec):
    """The shipped tool-calling cases (`eval served --tools`)."""

    name: str = "tools"
    description: str = ""
    max_tokens: int = Field(256, ge=1)
    cases: list[ToolCaseSpec] = Field(min_length=1)


class NeedleSpec(_Spec):
    """The shipped needle task (`eval served --needle`): `needle` holds {place} and {code}, `question` {place}."""

    name: str = "needle"
    description: str = ""
    min_tokens: int = Field(1024, ge=1)
    depths: list[float] = Field(min_length=1)
    answer_tokens: int = Field(24, ge=1)
    needle: str
    question: str
    places: list[str] = Field(min_length=1)
    filler: list[str] = Field(min_length=1)


SpecT = TypeVar("SpecT", bound=BaseModel)


def _where(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a field path: `tasks[0].cases[1].expect`."""
    out = ""
    for x in loc:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out or "(top level)"


def spec_problem(e: ValidationError) -> str:
    """The first wrong field of a spec and why, in one phrase."""
    err = e.errors()[0]
    msg = err["msg"][:1].lower() + err["msg"][1:]
    return f"{_where(tuple(err['loc']))}: {msg}"


def read_spec(
    path: Path, model: type[SpecT], what: str, hint: str, first: Callable[[Any], str | None] | None = None
) -> SpecT:
    """The spec in the JSON file `path`, as `model`; UsageError (exit 2) naming the file and the field.
    `first`: a check of the JSON before the model's, whose problem (a phrase) is said as it is."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{what} {path} is not readable JSON ({e})".splitlines()[0], hint=hint) from None
    problem = first(data) if first is not None else None
    if problem:
        raise UsageError(f"{what} {path}: {problem}", hint=hint)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise UsageError(f"{what} {path}: {spec_problem(e)}".splitlines()[0], hint=hint) from None


def evalsets_dir() -> Path:
    """The shipped gates and task sets (`qwenquant/data/evalsets/`)."""
    return Path(str(resources.files("qwenquant") / "data" / "evalsets"))


def tools_spec() -> ToolsSpec:
    """The shipped tool-calling cases."""
    return read_spec(evalsets_dir() / "tools.json", ToolsSpec, "task set", TASK_SET_HINT)


def needle_spec() -> NeedleSpec:
    """The shipped needle task."""
    return read_spec(evalsets_dir() / "needle.json", NeedleSpec, "task set", TASK_SET_HINT)
