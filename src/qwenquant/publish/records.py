"""The records publish writes, typed (pydantic, frozen, strict): the card record (`qwenquant-card.json`, sealed by
`card_self_digest`), the Hub metadata (the model card's YAML front matter) and the publish record (`qwenquant
publish --json`). Each one's JSON is what publish wrote before they were typed, key for key."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, JsonValue

from qwenquant.hashing import seal

CARD_SEAL = "card_self_digest"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object (every field, None included)."""
        return self.model_dump(mode="python")


class HubMeta(_Record):
    """The model card's front matter, in the order the card writes it; `base_model` (and its relation) only when
    the source is a Hub repo."""

    base_model: str | None = None
    base_model_relation: Literal["quantized"] | None = None
    library_name: str
    license: str
    pipeline_tag: str
    tags: list[str]

    def yaml(self) -> str:
        """The YAML between the card's `---` lines (no trailing newline)."""
        import yaml

        return yaml.safe_dump(self.model_dump(mode="python", exclude_none=True), sort_keys=False).rstrip()


class FileEntry(_Record):
    """A file the card record vouches for: its size and sha256."""

    size: int
    sha256: str


class FigureEntry(_Record):
    """One figure of the card: its value and text, the file and JSON path it was read from, what measured it."""

    section: str
    label: str
    value: JsonValue
    text: str
    source: str
    field: list[str | int]
    command: str
    machine: str | None


class CardBody(_Record):
    """The card record before it is sealed."""

    schema_version: Literal[1] = 1
    kind: Literal["qwenquant-card"] = "qwenquant-card"
    card_format: int
    license: str
    repo_id: str
    revision: str
    root_digest: str
    manifest_self_digest: str
    files: dict[str, FileEntry]
    figures: list[FigureEntry]
    signature: str | None


class CardRecord(CardBody):
    """`qwenquant-card.json`: the body and its self digest."""

    card_self_digest: str

    @classmethod
    def sealed(cls, body: CardBody) -> CardRecord:
        """The record of `body`, its self digest computed over the body's JSON."""
        return cls.model_validate(seal(body.to_json(), CARD_SEAL))

    def to_bytes(self) -> bytes:
        """The file's bytes (indented, sorted keys)."""
        import json

        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()


class PublishedFile(_Record):
    path: str
    size: int
    sha256: str


class PublishRecord(_Record):
    """What `qwenquant publish --json` prints: where, what was sent, deleted and kept, the card's text."""

    repo_id: str
    revision: str
    root_digest: str
    dry_run: bool
    noop: bool
    commit: str | None
    url: str | None
    files: list[PublishedFile]
    uploaded: list[str] | None  # None: no plan (a dry run)
    deleted: list[str] | None
    unchanged: list[str] | None
    signed: bool
    card: str
    warnings: list[str]
