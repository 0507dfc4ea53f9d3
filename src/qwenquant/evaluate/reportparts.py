"""The parts of an eval report, typed to the leaves (pydantic, as the recipe models): the offline arms and
their KL / top-1 figures, the lm_head and MTP figures, the goals; the served gate's tasks, MTP acceptance,
tool cases, needle depths and the speculation check. Each part's JSON is the report's, byte for byte:
a key absent from a run's result is absent from the part's JSON (`Part.to_json`: unset fields are left
out), a null stays null, an integer stays an integer where a number is declared (`Real`).
Read as JSON keys too (`part["name"]`, `part.get("name")`) where code still reads the report as a dict."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, JsonValue, PlainSerializer, WrapValidator

from qwenquant.reportpart import Part


def _keep_int(value: Any, handler: Any) -> Any:
    """An integer where a number is declared stays an integer (1 is written `1`, not `1.0`)."""
    return value if type(value) is int else handler(value)


def _pair(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


Real = Annotated[float, WrapValidator(_keep_int)]  # a JSON number (bool refused)
# a 95% interval [low, high], written as a JSON list
Pair = Annotated[tuple[Real, Real], BeforeValidator(_pair), PlainSerializer(list)]


# --- offline -------------------------------------------------------------------------------------


class Figures(Part):
    """One arm against a base (the bf16 reference, or the artifact for `vs_artifact`): paired perplexity with its
    t interval over windows, KL mean with its interval and per-token tail, top-1 agreement."""

    ppl: Real
    ppl_reference: Real
    delta_pct: Real
    ci95_pct: Pair
    windows_worse: int
    windows: int
    kl: Real
    kl_ci95: Pair
    top1: Real
    kl_p99: Real | None = None  # reports written before the tail lack these two
    kl_p999: Real | None = None


class KlPeak(Part):
    """The largest per-token KL: where it is, and the text it follows (up to 16 tokens and the token predicted)."""

    window: int
    token: int
    kl: Real
    text: str | None = None


class KlTailSupport(Part):
    """What the artifact's KL p99.9 rests on: its bootstrap interval over windows and the windows its tail is in."""

    value: Real
    ci95: Pair
    windows_above: int
    windows: int
    top_window: int
    top_window_share: Real
    max: KlPeak


class Arm(Figures):
    """A quantized arm against the reference; the artifact's carries the support of its KL p99.9."""

    kl_p999_support: KlTailSupport | None = None


class Int8Linears(Part):
    """Which int4 Linears the int8-activation arm ran with int8 inputs."""

    body: int
    mtp_head: int
    lm_head: bool


class Int8Arm(Figures):
    """The artifact run as vLLM's int8-activation path: against the reference, and against the artifact."""

    vs_artifact: Figures
    int32_overflows: int
    int8_linears: Int8Linears


class ReferenceArm(Part):
    ppl: Real


class Arms(Part):
    """Every arm of the offline eval, under the names the report gives them."""

    reference: ReferenceArm
    body: Arm = Field(alias="w4a16-body")
    rtn_head: Arm = Field(alias="w4a16+rtn-head")
    artifact: Arm
    int8: Int8Arm | None = Field(None, alias="artifact+int8-act")

    def compared(self) -> list[tuple[str, Figures]]:
        """(name, figures) of every arm but the reference, in the table's order."""
        named: list[tuple[str, Figures | None]] = [
            ("w4a16-body", self.body),
            ("w4a16+rtn-head", self.rtn_head),
            ("artifact", self.artifact),
            ("artifact+int8-act", self.int8),
        ]
        return [(n, a) for n, a in named if a is not None]


class HeadFigures(Part):
    """One lm_head on held-out hidden states: KL against the bf16 head, top-1 agreement, over how many tokens."""

    kl: Real
    top1: Real
    tokens: int


class LmHead(Part):
    """The calibrated head against the round-to-nearest one; `ratio` is null when the rtn KL is 0."""

    rtn: HeadFigures
    gptq: HeadFigures
    kl_reduction_pct: Real
    ratio: Real | None


class MtpAgreement(Part):
    """How often the MTP head's first draft is the model's own greedy t+2 token, with its t interval."""

    agree: Real
    agree_ci95: Pair
    acceptance_length_1: Real


class MtpInt8(MtpAgreement):
    """The int8-activation arm's MTP agreement, paired with the artifact's (percentage points)."""

    vs_artifact_points: Real
    vs_artifact_ci95_points: Pair


class Int4VsBf16(Part):
    """The shipped MTP head against the bf16 one on the artifact's states (points), and how often they draft alike."""

    delta_points: Real
    ci95_points: Pair
    same_draft: Real | None = None


class Mtp(Part):
    """The offline MTP figures; empty for a model without an MTP head."""

    reference: MtpAgreement | None = None
    artifact: MtpAgreement | None = None
    artifact_bf16_mtp: MtpAgreement | None = None
    int8: MtpInt8 | None = Field(None, alias="artifact+int8-act")
    change_pct: Real | None = None
    int4_vs_bf16: Int4VsBf16 | None = None


class Goal(Part):
    """One goal: its figure (null when it could not be computed), its limit, whether it is met."""

    value: Real | None
    max: Real
    met: bool


class Goals(Part):
    head_kl_ratio: Goal | None = None
    ppl_delta_pct: Goal | None = None
    mtp_acceptance_drop_pct: Goal | None = None

    def items(self) -> list[tuple[str, Goal]]:
        """(name, goal) of each goal the report has."""
        return [(k, g) for k in type(self).model_fields if (g := getattr(self, k)) is not None]


class OfflineFigures(Part):
    """What the offline forwards measured: every arm, the lm_head alone, the MTP head."""

    arms: Arms
    lm_head: LmHead
    mtp: Mtp


class OfflineRun(OfflineFigures):
    """One offline measurement (evaluate/offline.py's run_offline): the figures, on how many windows of how
    many tokens, where and how the forwards ran, how long it took."""

    windows: int
    window_len: int
    device: str
    forward: str  # dense | streamed
    seconds: Real
    activations: str


class ReferenceCheck(Part):
    """Whether the reference is the artifact's recorded source, and how many of its files were hashed."""

    verified: bool
    recorded_source: str
    files: int | None = None


class TextSource(Part):
    """Where the windows came from: a file, the tiny reference's held-out text, or a pinned text set."""

    text: str
    text_set: str | None = None
    repo: str | None = None
    revision: str | None = None
    file: str | None = None
    sha256: str | None = None
    license: str | None = None


# --- served --------------------------------------------------------------------------------------


class CaseFailure(Part):
    prompt: str
    expect: str
    got: str


class Task(Part):
    """One exact-match task of the gate: cases passed of total, how many it needs, the failing cases."""

    name: str
    passed: int
    total: int
    min_pass: int
    failures: list[CaseFailure]


class Acceptance(Part):
    """MTP acceptance over the run from /metrics deltas; `unavailable` says why /metrics could not be read."""

    metrics_present: bool
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    mean_acceptance_length: Real | None
    per_position: dict[str, Real | None]
    over: list[str]  # which requests the figures cover: gate tasks, tool cases, needle cases
    unavailable: str | None = None


class ToolCall(Part):
    """One tool call as the server sent it (its arguments as sent: a JSON string, when well formed)."""

    name: JsonValue
    arguments: JsonValue


class ToolCase(Part):
    """One tool-calling case: what the answer was (tool_call | answer | malformed | wrong_choice | error)."""

    name: str
    tool_choice: JsonValue
    kind: str
    problems: list[str]
    ok: bool
    calls: list[ToolCall] | None = None  # absent when the request failed
    content: str | None = None


class ToolCounts(Part):
    tool_call: int
    answer: int
    malformed: int
    wrong_choice: int
    error: int


class Tools(Part):
    gate: str
    cases: list[ToolCase]
    counts: ToolCounts


class NeedleDepth(Part):
    """One needle case: where the needle sat, the prompt's length, whether the answer held the code."""

    depth: Real
    needle_tokens: int
    expect: str
    prompt_tokens: int
    passed: bool
    answer: str | None = None
    error: str | None = None


class Needle(Part):
    gate: str
    max_model_len: int | None
    limit: int
    depths: list[NeedleDepth]
    passed: int
    total: int


class SpecPrompt(Part):
    """One prompt of the speculation check: where generation with MTP first differs from without (null: never),
    with both servers' ids there and how far the drafted token lies below the best (null: not in the top 5)."""

    prompt_tokens: int
    one_plus_k: bool
    generated: int
    first_divergence: int | None
    with_mtp: list[int] | None = None
    without: list[int] | None = None
    tie_gap: Real | None = None
    tie: bool | None = None


class SpecCheck(Part):
    draft_tokens: int
    prompts: list[SpecPrompt]
    tie_nats: Real
    diverged: int
    changed: int
    ok: bool
    reference_url: str | None = None  # the server without speculation, when eval did not start it (--reference-url)


class ServedMachine(Part):
    """The server eval started (--serve ARTIFACT): what was served, how, on what (serve/launched.py's info)."""

    artifact: str
    artifact_root_digest: str
    profile: str | None
    gpu_mem: str | None
    gpu_mem_limit: str | None
    gpus: int
    split: str | None
    extra_vllm_flags: list[str]
    device: str
    activations: str | None
    vllm_version_installed: str | None
    command: str
    server_log: str
