"""The workload: the shipped bench config and prompt set, the cells a run measures, request bodies (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qwenquant.errors import UsageError

THINKING_CHOICES = ("auto", "both", "on", "off", "default")


class TooGood(BaseModel):
    model_config = ConfigDict(extra="forbid")
    wall_tok_s: float = Field(gt=0)
    decode_tok_s: float = Field(gt=0)
    prefill_tok_s: float = Field(gt=0)
    aggregate_tok_s: float = Field(gt=0)
    ratio: float = Field(gt=1)


class BenchConfig(BaseModel):
    """bench.yaml: output length, repeats, sampling presets and the too-good lines."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    max_tokens: int = Field(gt=1)
    warmup_requests: int = Field(ge=0)
    repeats: int = Field(ge=1)
    rounds: int = Field(ge=1)
    ladder_prompt: str
    sampling: dict[str, dict[str, Any]]
    too_good: TooGood
    ttft_floor_s: float = Field(ge=0)
    wall_decode_margin: float = Field(gt=0)
    prompts: dict[str, str] = Field(default_factory=dict)


def _read_yaml(path: Path | None, packaged: str) -> dict[str, Any]:
    import yaml

    try:
        text = (
            path.read_text()
            if path
            else resources.files("qwenquant.bench").joinpath("data").joinpath(packaged).read_text()
        )
        d = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as e:
        raise UsageError(f"cannot read {path or packaged}: {e}", hint="check the file path and YAML syntax") from None
    if not isinstance(d, dict):
        raise UsageError(f"{path or packaged} is not a YAML mapping", hint="start from the shipped bench.yaml")
    return d


def load_config(path: Path | None = None, prompts_path: Path | None = None) -> BenchConfig:
    """The bench config (shipped or `path`) with its prompt set; every invalid field is named."""
    d = _read_yaml(path, "bench.yaml")
    d.setdefault("prompts", _read_yaml(prompts_path, "prompts.yaml").get("prompts") or {})
    try:
        cfg = BenchConfig.model_validate(d)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise UsageError(
            f"invalid bench config {path or 'bench.yaml'}: {problems}",
            hint="compare with the shipped src/qwenquant/bench/data/bench.yaml",
        ) from None
    if cfg.ladder_prompt not in cfg.prompts:
        raise UsageError(
            f"ladder_prompt {cfg.ladder_prompt!r} is not a prompt ({', '.join(cfg.prompts)})",
            hint="name one of the prompts in ladder_prompt",
        )
    return cfg


@dataclass(frozen=True)
class Cell:
    """One measured condition. thinking None: no chat_template_kwargs sent (the template's default)."""

    prompt: str
    sampling: str
    thinking: bool | None
    concurrency: int = 1

    @property
    def key(self) -> str:
        think = {None: "default", True: "on", False: "off"}[self.thinking]
        return f"{self.prompt}/{self.sampling}/think-{think}/c{self.concurrency}"


def ladder(max_concurrency: int) -> list[int]:
    """1, 2, 4, ... up to max_concurrency, which is always the last level."""
    levels, c = [], 1
    while c < max_concurrency:
        levels.append(c)
        c *= 2
    return levels + [max(1, max_concurrency)]


def thinking_modes(choice: str, supported: bool | None) -> list[bool | None]:
    """Which thinking settings to run: `auto` runs off and on when the template supports the switch."""
    if choice not in THINKING_CHOICES:
        raise UsageError(f"unknown --thinking {choice!r}", hint=f"use one of {', '.join(THINKING_CHOICES)}")
    if choice == "auto":
        return [False, True] if supported else [None]
    modes: dict[str, list[bool | None]] = {"both": [False, True], "on": [True], "off": [False], "default": [None]}
    return modes[choice]


def plan_cells(
    cfg: BenchConfig, prompts: list[str], samplings: list[str], thinking: list[bool | None], max_concurrency: int
) -> tuple[list[Cell], list[Cell]]:
    """(all cells, the ladder's cells): the matrix at one stream, then the ladder (the config's
    ladder prompt when selected, else the first prompt; greedy; the first thinking mode), whose
    level 1 is a matrix cell."""
    for name, known, what in ((prompts, cfg.prompts, "prompt"), (samplings, cfg.sampling, "sampling")):
        bad = [n for n in name if n not in known]
        if bad:
            raise UsageError(f"unknown {what} {', '.join(bad)}", hint=f"choose from {', '.join(known)}")
    cells = [Cell(p, s, t) for p in prompts for s in samplings for t in thinking]
    ladder_sampling = "greedy" if "greedy" in samplings else samplings[0]
    ladder_prompt = cfg.ladder_prompt if cfg.ladder_prompt in prompts else prompts[0]
    steps = [Cell(ladder_prompt, ladder_sampling, thinking[0], c) for c in ladder(max_concurrency)]
    return cells + [c for c in steps if c not in cells], steps


def request_body(cfg: BenchConfig, model: str, cell: Cell, *, max_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    """The chat completion request of one cell (stream and usage are added by the client)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": cfg.prompts[cell.prompt]}],
        "max_tokens": max_tokens,
        **cfg.sampling[cell.sampling],
    }
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM extension: generate exactly max_tokens
    # vLLM extension, as in depth/soak/turns: the streamed tokens are then counted exactly against usage (with
    # MTP a chunk carries several tokens, so counting chunks would be a floor and usage could not be checked)
    body["return_token_ids"] = True
    if cell.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": cell.thinking}
    return body
