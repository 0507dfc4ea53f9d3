"""The model card (README.md) and its record (qwenquant-card.json), built from the manifest, the
artifact's own config and index, and the reports keyed to its root digest.

The card is outside the manifest's hashed file set (the root digest is untouched); the record names
the root digest and the manifest's self digest and holds the card's and every report's sha256, sealed
by `card_self_digest`, so `qwenquant verify` can tell a card edited after publishing. Same inputs, same
bytes: a re-run of `qwenquant publish` finds the card already there, and `verify` (publish/cardcheck.py)
re-derives the card from the manifest and the reports and refuses one that differs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenquant.manifest import CARD_NAME, MANIFEST_NAME, SIGNATURE_NAME, Manifest
from qwenquant.publish.figures import Figure
from qwenquant.publish.records import CardBody, CardRecord, FileEntry, HubMeta
from qwenquant.publish.reports import Report

# The card's text layout; a card record of this format is re-derived byte for byte by `verify`
# (bump it with any change to what build_card writes).
CARD_FORMAT = 2


@dataclass(frozen=True)
class CardFacts:
    """What the artifact's files say about themselves (read by `read_facts`)."""

    architectures: tuple[str, ...]
    model_type: str
    layout: str  # "text-only" | "multimodal"
    mtp_tensors: int
    mtp_files: tuple[str, ...]
    vision_tensors: int
    lm_head_bits: int | None  # int4 lm_head: 4; None when the head is not quantized
    group_size: int | None
    source_license: str | None = None
    vllm_line: str | None = None  # the plain `vllm serve` line, when the recipe's profile builds one
    serve_flags: str = ""  # what `qwenquant serve --profile single-user` needs after it to start (a short model)
    warnings: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Card:
    readme: bytes
    record: CardRecord

    @property
    def record_bytes(self) -> bytes:
        return self.record.to_bytes()

    def head(self, lines: int = 12) -> list[str]:
        return self.readme.decode().splitlines()[:lines]


def front_matter(manifest: Manifest, facts: CardFacts, license_id: str) -> HubMeta:
    """The Hub metadata block (base_model only when the source is a Hub repo)."""
    base = manifest.source.get("repo") if manifest.source.get("kind") == "fetched" else None
    tags = ["compressed-tensors", "w4a16", "gptq", "int4"]
    if facts.lm_head_bits == 4:
        tags.append("int4-lm-head")
    if facts.mtp_tensors:
        tags.append("mtp")
    tags += [facts.model_type, *facts.architectures, "qwenquant"]
    return HubMeta(
        base_model=str(base) if base else None,
        base_model_relation="quantized" if base else None,
        library_name="transformers",
        license=license_id,
        pipeline_tag="image-text-to-text" if facts.vision_tensors else "text-generation",
        tags=tags,
    )


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    return [
        f"| {' | '.join(head)} |",
        f"|{'---|' * len(head)}",
        *(f"| {' | '.join(cell(x) for x in r)} |" for r in rows),
    ]


def _what(manifest: Manifest, facts: CardFacts) -> list[str]:
    q = manifest.recipe.get("quantization") or {}
    head = (
        f"int{facts.lm_head_bits} (group {facts.group_size}, GPTQ calibrated on final-norm activations)"
        if facts.lm_head_bits
        else "kept bf16"
    )
    mtp_q = (manifest.recipe.get("mtp") or {}).get("quantize") == "gptq"
    kept = (
        f"its Linears GPTQ int{q.get('num_bits', 4)} group {q.get('group_size')} like the body, norms bf16"
        if mtp_q
        else "kept bf16"
    )
    mtp = (
        f"{facts.mtp_tensors} `mtp.*` tensors in {', '.join(facts.mtp_files)}, {kept} (vLLM's MTP drafter)"
        if facts.mtp_tensors
        else "not shipped (no `mtp.*` tensors in the weights)"
    )
    vision = f"{facts.vision_tensors} tensors, kept bf16" if facts.vision_tensors else "not shipped (text-only)"
    return [
        "## What is in it",
        "",
        f"- architecture: {', '.join(facts.architectures)} (`{facts.model_type}`), layout {facts.layout}",
        f"- weights: {q.get('scheme', 'W4A16')}, int{q.get('num_bits', 4)} group {q.get('group_size')} "
        f"{'symmetric' if q.get('symmetric', True) else 'asymmetric'}, {q.get('method', 'gptq')} "
        f"(act-order {q.get('actorder')}); not quantized: {', '.join(f'`{x}`' for x in q.get('ignore') or [])}",
        f"- lm_head: {head}",
        f"- MTP head: {mtp}",
        f"- vision tower: {vision}",
        f"- recipe `{manifest.recipe.get('name')}` (sha256 `{manifest.recipe_sha256}`): {manifest.recipe.get('description', '')}",
        "",
    ]


def _provenance(manifest: Manifest) -> list[str]:
    s, c = manifest.source, manifest.calibration
    where = (
        f"[{s['repo']}](https://huggingface.co/{s['repo']}) at commit `{s.get('commit')}` (revision {s.get('revision')}), "
        "every file verified against its fetch record"
        if s.get("kind") == "fetched"
        else "a local folder, hashed as it was (not verified against a fetch record)"
    )
    data = c.get("dataset") or ", ".join(sorted(c.get("files") or {})) or "?"
    calib = (
        f"{data}{' @ ' + str(c['revision']) if c.get('revision') else ''}, split {c.get('split')}: "
        f"{c.get('num_samples')} samples x {c.get('max_length')} tokens ({c.get('token_total')} tokens), "
        f"fingerprint sha256 `{c.get('fingerprint_sha256')}`"
    )
    tools = ", ".join(f"{k} {v}" for k, v in sorted(manifest.tool_versions.items()))
    rows = [(p, f.get("size"), f"`{f.get('sha256')}`") for p, f in sorted((s.get("files") or {}).items())]
    return [
        "## How it was made",
        "",
        f"Source: {where}.",
        "",
        *_table(("source file", "bytes", "sha256"), rows),
        "",
        f"Calibration: {calib}.",
        "",
        f"Tools: {tools}.",
        "",
    ]


def _measured(figures: Sequence[Figure], missing: Sequence[tuple[str, str]]) -> list[str]:
    out = ["## Measured", ""]
    if figures:
        out += _table(
            ("section", "figure", "value", "source", "measured by", "machine"),
            [(f.section, f.label, f.text, f"`{f.source}`", f"`{f.command}`", f.machine or "") for f in figures],
        )
        out += [
            "",
            f"Each value is copied from the file in the source column (published beside this card; "
            f"`{MANIFEST_NAME}` for what quantize measured), every one of them keyed to the root digest above.",
            "",
        ]
    out += [f"- {section}: not measured (`{cmd}`)" for section, cmd in missing]
    return out + ([""] if missing else [])


def _use(repo_id: str, revision: str, facts: CardFacts, root: str) -> list[str]:
    name = repo_id.split("/")[-1]
    out = [
        "## Use it",
        "",
        "```",
        f"qwenquant fetch {repo_id} --revision {revision} --root sha256:{root} --out models/{name}",
        f"qwenquant verify models/{name}",
        f"qwenquant serve models/{name} --profile single-user{facts.serve_flags}",
        "```",
        "",
        "`qwenquant fetch` checks every byte against the Hub's hashes, then against the manifest and this card, "
        "and refuses an artifact whose root digest is not the one after `--root`; `qwenquant verify` re-hashes "
        "the folder at any time and names the same digest.",
    ]
    if facts.vllm_line:
        out += [
            "",
            "Plain vLLM on the fetched folder (the command `qwenquant serve` runs on one CUDA GPU):",
            "",
            "```",
            facts.vllm_line.replace("MODEL_DIR", f"models/{name}").replace("MODEL_NAME", name),
            "```",
        ]
    return out + [""]


def _checking(name: str) -> list[str]:
    d = f"models/{name}"
    return [
        "## Checking a download",
        "",
        f"- `{MANIFEST_NAME}` lists every weight and config file with its size and sha256; its root digest names "
        "them all. `qwenquant verify` fails on any missing, extra or changed byte.",
        "- This card, `qwenquant-card.json` and `qwenquant-reports/` are outside that hashed set: the card record "
        "holds their sha256 and names the root digest, and `qwenquant verify` re-derives this card from the "
        "manifest and the reports, so a card whose figures, digest or descriptions differ from them is refused. "
        "The root digest does not vouch for the reports' figures: only a signature says who published them.",
        f"- When this repo holds `model.sig`, it is a sigstore model_signing signature over the manifest's files, "
        "the manifest, this card, its record and the reports: "
        f"`qwenquant verify {d} --signature {d}/model.sig --public-key PUBLISHER.pub`, or "
        f"`model_signing verify key {d} --signature {d}/model.sig --public_key PUBLISHER.pub`. Take the public key "
        "from the publisher, never from this repo.",
        "",
    ]


def build_card(
    manifest: Manifest,
    manifest_self_digest: str,
    facts: CardFacts,
    *,
    repo_id: str,
    revision: str,
    license_id: str,
    reports: Sequence[Report],
    figures: Sequence[Figure],
    missing: Sequence[tuple[str, str]],
    signed: bool = False,
) -> Card:
    """README.md and its sealed record; deterministic in its inputs. `signed`: the record names the
    signature published beside it (a repo without it is refused by fetch and verify)."""
    name = repo_id.split("/")[-1]
    qv = manifest.tool_versions.get("qwenquant", "?")
    lines = [
        "---",
        front_matter(manifest, facts, license_id).yaml(),
        "---",
        "",
        f"# {name}",
        "",
        f"{manifest.source.get('repo') or 'A Qwen3.5-architecture model'} quantized to W4A16 by qwenquant {qv}. "
        f"`{MANIFEST_NAME}` lists every file of the artifact with its sha256; its root digest is",
        "",
        f"    sha256:{manifest.root_digest}",
        "",
        *_use(repo_id, revision, facts, manifest.root_digest),
        *_measured(figures, missing),
        *_what(manifest, facts),
        *_provenance(manifest),
        "## Files",
        "",
        *_table(("file", "bytes", "sha256"), [(f.path, f.size, f"`{f.sha256}`") for f in manifest.files]),
        "",
        *_checking(name),
    ]
    readme = ("\n".join(lines).rstrip() + "\n").encode()
    files = {CARD_NAME: FileEntry(size=len(readme), sha256=hashlib.sha256(readme).hexdigest())}
    files.update({r.repo_path: FileEntry(size=len(r.raw), sha256=r.sha256) for r in reports})
    body = CardBody(
        card_format=CARD_FORMAT,
        license=license_id,
        repo_id=repo_id,
        revision=revision,
        root_digest=manifest.root_digest,
        manifest_self_digest=manifest_self_digest,
        files=files,
        figures=[f.entry() for f in figures],
        signature=SIGNATURE_NAME if signed else None,
    )
    return Card(readme, CardRecord.sealed(body))


def read_facts(artifact: Path, manifest: Manifest, license_id: str | None) -> CardFacts:
    """Architecture, MTP and vision tensors, lm_head bits from the artifact's config.json and index;
    the source's license from its README front matter; the plain vLLM line from the recipe."""
    from qwenquant.checkpoint.config import read_config, read_weight_map
    from qwenquant.checkpoint.header import read_header
    from qwenquant.checkpoint.names import VISION_PREFIX, is_mtp

    config = read_config(artifact)
    weight_map = read_weight_map(artifact)
    if weight_map is None:  # one shard, no index: its header names the tensors
        weight_map = {
            n: f.path
            for f in manifest.files
            if f.path.endswith(".safetensors")
            for n in read_header(artifact / f.path).tensors
        }
    names = sorted(weight_map)
    mtp = sorted({weight_map[n] for n in names if is_mtp(n)})
    qc = config.get("quantization_config") or {}
    head_bits, group = None, None
    for g in (qc.get("config_groups") or {}).values():
        w = g.get("weights") or {}
        if any("lm_head" in str(t) for t in g.get("targets") or []):
            head_bits = w.get("num_bits")
        group = group or w.get("group_size")
    warnings: list[str] = []
    lic = license_id or _source_license(manifest)
    if lic is None:
        warnings.append("the source's license is unknown: the card says `license: other` (pass --license ID)")
    return CardFacts(
        tuple(config.get("architectures") or ()),
        str(config.get("model_type")),
        str((manifest.recipe.get("artifact") or {}).get("layout", "text-only")),
        sum(1 for n in names if is_mtp(n)),
        tuple(mtp),
        sum(1 for n in names if n.startswith(VISION_PREFIX) or ".visual." in n),
        head_bits,
        group,
        lic or "other",
        _vllm_line(manifest, config),
        _serve_flags(manifest, config),
        tuple(warnings),
    )


def _source_license(manifest: Manifest) -> str | None:
    """`license:` of the source folder's README.md front matter, when that folder is still there."""
    import yaml

    path = ((manifest.stages.get("source") or {}).get("params") or {}).get("path")
    readme = Path(path) / CARD_NAME if path else None
    try:
        text = readme.read_text() if readme else ""
        meta = yaml.safe_load(text[4:].split("\n---", 1)[0]) if text.startswith("---\n") else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    lic = meta.get("license") if isinstance(meta, dict) else None
    return str(lic) if lic else None


def _serve_flags(manifest: Manifest, config: dict[str, Any]) -> str:
    """` -- --max-model-len N` when the single-user profile's length is beyond the model's positions (what
    `qwenquant serve` would refuse, exit 7: the card's command must start), else ""."""
    from qwenquant.errors import QwenquantError
    from qwenquant.serve.preflight import recipe_from_manifest

    try:
        profile = recipe_from_manifest(manifest).profile("single-user")
    except (QwenquantError, ValueError, KeyError):
        return ""
    limit = (config.get("text_config") or config).get("max_position_embeddings")
    return f" -- --max-model-len {limit}" if isinstance(limit, int) and profile.max_model_len > limit else ""


def _vllm_line(manifest: Manifest, config: dict[str, Any]) -> str | None:
    """`vllm serve MODEL_DIR ...` for the recipe's single-user profile on CUDA, served as `qwenquant serve`
    names it (MODEL_NAME: the fetched folder's name, except for the real 27B); None without that profile."""
    import shlex

    from qwenquant.errors import QwenquantError
    from qwenquant.serve.argv import build_vllm_argv
    from qwenquant.serve.preflight import recipe_from_manifest, served_name

    try:
        profile = recipe_from_manifest(manifest).profile("single-user")
        name = served_name(Path("MODEL_NAME"), config, profile.served_model_name)
        limit = (config.get("text_config") or config).get("max_position_embeddings")
        update: dict[str, Any] = {"served_model_name": name}
        if isinstance(limit, int) and profile.max_model_len > limit:  # what `qwenquant serve` would refuse
            update["max_model_len"] = limit
        args = build_vllm_argv(Path("MODEL_DIR"), profile.model_copy(update=update), manifest, "cuda")
    except (QwenquantError, ValueError, KeyError):
        return None
    return f"vllm serve MODEL_DIR {shlex.join(args[2:])}"
