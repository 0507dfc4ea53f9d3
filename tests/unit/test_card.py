"""The model card: Hub front matter that parses, figures traceable to reports of this root digest only,
"not measured" where a report is absent, facts read from the artifact's own files, the same bytes on a
re-run, and a card record that `qwenquant verify` accepts only while the card is unchanged.

The reports are written here in the shape `qwenquant eval` (offline and served) and `qwenquant bench`
write them (evaluate/offline.py, evaluate/served.py + commands/eval.py, bench/report.py + session.py):
producing real ones needs torch forwards and a served model, which the integration tests cover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qwenquant.errors import UsageError
from qwenquant.evaluate.report import report_path
from qwenquant.hashing import sha256_json
from qwenquant.manifest import (
    CARD_NAME,
    CARD_RECORD_NAME,
    build_manifest,
    card_record_problem,
    load_manifest,
    verify_artifact,
    write_manifest,
)
from qwenquant.publish.card import build_card, read_facts
from qwenquant.publish.figures import collect_figures, lookup, not_measured
from qwenquant.publish.reports import gather_reports
from qwenquant.recipe import load_recipe

REPO = "me/Qwen3.8-27B-w4a16"
SOURCE = {
    "kind": "fetched",
    "verified": True,
    "repo": "Qwen/Qwen3.8-27B",
    "repo_type": "model",
    "revision": "main",
    "commit": "a" * 40,
    "files": {"config.json": {"size": 10, "sha256": "b" * 64}},
}
CALIBRATION = {
    "dataset": "HuggingFaceH4/ultrachat_200k",
    "revision": "c" * 40,
    "split": "train_sft",
    "num_samples": 512,
    "max_length": 2048,
    "token_total": 1048576,
    "fingerprint_sha256": "d" * 64,
}
CELL = "narrative/greedy/think-off/c1"


def _artifact(tmp: Path, *, mtp: bool = True, quality: dict | None = None) -> Path:
    """A folder with the files the card reads (config.json with its quantization_config, the index)."""
    art = tmp / "q27b"
    art.mkdir(parents=True)
    groups = {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 128}},
        "group_1": {"targets": ["re:.*lm_head$"], "weights": {"num_bits": 4, "group_size": 128}},
    }
    (art / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3_5ForCausalLM"],
                "model_type": "qwen3_5_text",
                "quantization_config": {"config_groups": groups},
            }
        )
    )
    names = ["model.language_model.layers.0.mlp.down_proj.weight_packed", "lm_head.weight_packed"]
    names += [f"mtp.layers.0.t{i}" for i in range(15)] if mtp else []
    wm = {n: "model-mtp.safetensors" if n.startswith("mtp.") else "model-00001-of-00001.safetensors" for n in names}
    (art / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    recipe = load_recipe("w4a16-int4head").canonical()
    write_manifest(
        art,
        build_manifest(
            art,
            source=SOURCE,
            recipe=recipe,
            recipe_sha256=sha256_json(recipe),
            calibration=CALIBRATION,
            stages={},
            quality=quality or {},
            tool_versions={"qwenquant": "0.1.0", "llmcompressor": "0.14.0.1"},
        ),
    )
    return art


def _eval_report(root: str) -> dict:
    return {
        "arms": {
            "reference": {"ppl": 7.1},
            "artifact": {
                "ppl": 7.2,
                "delta_pct": 1.41,
                "ci95_pct": [1.1, 1.7],
                "kl": 0.0123,
                "top1": 0.951,
                "windows": 32,
                "windows_worse": 25,
            },
        },
        "lm_head": {"rtn": {"kl": 0.02, "top1": 0.9}, "gptq": {"kl": 0.008, "top1": 0.93}, "ratio": 0.4},
        "mtp": {
            "reference": {"agree": 0.62, "acceptance_length_1": 1.62},
            "artifact": {"agree": 0.61, "acceptance_length_1": 1.61},
            "change_pct": -0.62,
            "int4_vs_bf16": {"delta_points": -0.3, "ci95_points": [-0.7, 0.1], "same_draft": 0.972},
        },
        "windows": 32,
        "window_len": 256,
        "device": "cuda",
        "forward": "streamed",
        "root_digest": root,
    }


def _served_report(root: str) -> dict:
    return {
        "url": "http://127.0.0.1:8000",
        "model": "q",
        "gate": "tiny-reference",
        "tasks": [{"name": "copy", "passed": 5, "total": 5, "min_pass": 5, "failures": []}],
        "mtp": {
            "metrics_present": True,
            "drafts": 120,
            "draft_tokens": 360,
            "accepted_tokens": 180,
            "mean_acceptance_length": 2.5,
            "per_position": {"0": 0.7, "1": 0.5, "2": 0.3},
        },
        "served": {
            "artifact_root_digest": root,
            "profile": "single-user",
            "device": "cuda",
            "gpu_mem": "24GiB",
            "vllm_version_installed": "0.19.1",
        },
        "root_digest": root,
        "ok": True,
    }


def _bench_report(root: str) -> dict:
    fig = {"median": 81.5, "min": 80.0, "max": 83.0, "n": 3}
    return {
        "schema_version": 1,
        "tool": "qwenquant bench",
        "gpu_name": "NVIDIA GeForce RTX 4090",
        "argv": ["qwenquant", "bench", "--serve", "artifacts/q27b", "--profile", "single-user"],
        "targets": [
            {
                "label": "A",
                "profile": "single-user",
                "artifact_root_digest": root,
                "vllm_version": "0.19.1",
                "acceptance": {"speculative": True, "mean_acceptance_length": 2.4},
                "cells": {
                    CELL: {
                        "figures": {
                            "decode_tok_s": fig,
                            "wall_tok_s": fig,
                            "ttft_s": {"median": 0.12, "min": 0.1, "max": 0.2, "n": 3},
                        }
                    }
                },
            }
        ],
    }


def _card(art: Path, reports: list[Path] = ()):
    m = load_manifest(art)
    raw = json.loads((art / "qwenquant-manifest.json").read_text())
    reps = gather_reports(art, m.root_digest, reports)
    figs = collect_figures(m, reps, m.root_digest)
    facts = read_facts(art, m, "apache-2.0")
    card = build_card(
        m,
        raw["manifest_self_digest"],
        facts,
        repo_id=REPO,
        revision="main",
        license_id="apache-2.0",
        reports=reps,
        figures=figs,
        missing=not_measured(figs),
    )
    return card, reps, raw


def _write(path: Path, obj: dict) -> Path:
    path.write_text(json.dumps(obj, indent=2))
    return path


def _measured_rows(readme: str) -> list[list[str]]:
    block = readme.split("## Measured", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| section")]
    return [[c.strip() for c in r.strip("|").split(" | ")] for r in rows]


def test_front_matter_parses_and_carries_the_hub_fields(tmp_path: Path) -> None:
    card, _, _ = _card(_artifact(tmp_path))
    text = card.readme.decode()
    assert text.startswith("---\n")
    meta = yaml.safe_load(text[4:].split("\n---\n", 1)[0])
    assert meta["base_model"] == "Qwen/Qwen3.8-27B" and meta["base_model_relation"] == "quantized"
    assert meta["library_name"] == "transformers" and meta["license"] == "apache-2.0"
    assert meta["pipeline_tag"] == "text-generation"
    assert {"compressed-tensors", "w4a16", "gptq", "int4-lm-head", "mtp", "Qwen3_5ForCausalLM"} <= set(meta["tags"])


def test_every_figure_is_traceable_to_a_report_of_this_root_digest(tmp_path: Path) -> None:
    art = _artifact(tmp_path)
    root = load_manifest(art).root_digest
    _write(report_path(art, root, "eval"), _eval_report(root))  # found beside the artifact
    _write(report_path(art, root, "eval-served"), _served_report(root))
    bench = _write(tmp_path / "bench.json", _bench_report(root))
    card, reps, manifest = _card(art, [bench])
    assert [r.repo_path for r in reps] == [
        "qwenquant-reports/eval.json",
        "qwenquant-reports/eval-served.json",
        "qwenquant-reports/bench.json",
    ]
    published = {r.repo_path: json.loads(r.raw) for r in reps} | {"qwenquant-manifest.json": manifest}
    for r in reps:
        assert card.record.to_json()["files"][r.repo_path]["sha256"] == r.sha256
        assert report_digests_of(published[r.repo_path]) == {root}
    figures = card.record.to_json()["figures"]
    assert {f["section"] for f in figures} == {"offline eval", "served gate", "MTP acceptance (served)", "throughput"}
    rows = _measured_rows(card.readme.decode())
    assert len(rows) == len(figures)
    for f, row in zip(figures, rows, strict=True):
        assert lookup(published[f["source"]], f["field"]) == f["value"], f  # the value is the report's own
        assert row[:4] == [f["section"], f["label"], f["text"], f"`{f['source']}`"]
    texts = {(f["label"], f["text"]) for f in figures}
    assert ("perplexity vs bf16 source", "+1.41%") in texts
    assert ("mean acceptance length", "2.500") in texts
    assert ("MTP t+2 agreement, shipped vs bf16 MTP head (points, same windows)", "-0.30 [-0.70, +0.10]") in texts
    assert ("MTP first draft the same token as the bf16 MTP head's", "97.20%") in texts
    assert (f"A (single-user) {CELL}: decode_tok_s median", "81.50 tok/s") in texts
    served = next(f for f in figures if f["label"] == "mean acceptance length")
    assert served["machine"] == "cuda, --gpu-mem 24GiB, vLLM 0.19.1"  # served figures name where they ran
    bench_fig = next(f for f in figures if f["section"] == "throughput")
    assert bench_fig["machine"].startswith("NVIDIA GeForce RTX 4090") and bench_fig["command"].startswith(
        "qwenquant bench"
    )
    assert "not measured" not in card.readme.decode()


def report_digests_of(data: dict) -> set[str]:
    from qwenquant.publish.reports import report_digests, report_kind

    return report_digests(report_kind(data), data)


@pytest.mark.parametrize("kind", ["eval", "eval-served", "bench"])
def test_a_report_of_another_root_digest_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    art = _artifact(tmp_path)
    other = "e" * 64
    make = {"eval": _eval_report, "eval-served": _served_report, "bench": _bench_report}[kind]
    foreign = _write(tmp_path / f"{kind}-other.json", make(other))
    with pytest.raises(UsageError) as e:
        _card(art, [foreign])
    assert "\n" not in e.value.message
    assert f"root digest {other[:16]}" in e.value.message and str(foreign) in e.value.message
    assert "cannot go on this card" in e.value.message


def test_an_eval_against_an_unverified_reference_is_refused(tmp_path: Path) -> None:
    """`eval --reference-unverified` compared two models of the user's choosing: not card figures."""
    art = _artifact(tmp_path)
    root = load_manifest(art).root_digest
    unverified = _write(tmp_path / "unverified.json", {**_eval_report(root), "reference_check": {"verified": False}})
    with pytest.raises(
        UsageError,
        match="not the artifact's recorded source .--reference-unverified.: its figures cannot go on this card",
    ):
        _card(art, [unverified])
    verified = _write(tmp_path / "verified.json", {**_eval_report(root), "reference_check": {"verified": True}})
    assert [r.kind for r in _card(art, [verified])[1]] == ["eval"]


def test_a_renamed_foreign_report_beside_the_artifact_is_refused(tmp_path: Path) -> None:
    art = _artifact(tmp_path)
    root = load_manifest(art).root_digest
    _write(report_path(art, root, "eval"), _eval_report("f" * 64))  # right name, another artifact's figures
    with pytest.raises(UsageError, match="cannot go on this card"):
        _card(art)


def test_not_measured_where_no_report_and_quick_eval_from_the_manifest(tmp_path: Path) -> None:
    quality = {"eval": {k: v for k, v in _eval_report("x").items() if k != "root_digest"}}
    card, reps, _ = _card(_artifact(tmp_path, quality=quality))
    text = card.readme.decode()
    assert reps == []
    assert "- served gate: not measured (`qwenquant eval served --serve" in text
    assert "- throughput: not measured (`qwenquant bench run --serve" in text
    assert "- offline eval: not measured" not in text  # the manifest's quick eval is there
    assert {f["source"] for f in card.record.to_json()["figures"]} == {"qwenquant-manifest.json"}


def test_the_card_says_what_the_files_hold(tmp_path: Path) -> None:
    with_mtp, _, _ = _card(_artifact(tmp_path / "a"))
    assert "- MTP head: 15 `mtp.*` tensors in model-mtp.safetensors, kept bf16" in with_mtp.readme.decode()
    without, _, _ = _card(_artifact(tmp_path / "b", mtp=False))
    text = without.readme.decode()
    assert "- MTP head: not shipped (no `mtp.*` tensors in the weights)" in text
    assert "mtp" not in yaml.safe_load(text[4:].split("\n---\n", 1)[0])["tags"]


def test_same_inputs_same_bytes(tmp_path: Path) -> None:
    art = _artifact(tmp_path)
    a, _, _ = _card(art)
    b, _, _ = _card(art)
    assert a.readme == b.readme and a.record_bytes == b.record_bytes


def test_verify_accepts_the_card_only_as_its_record_holds_it(tmp_path: Path) -> None:
    art = _artifact(tmp_path)
    card, _, raw = _card(art)
    m = load_manifest(art)
    assert card_record_problem(card.record.to_json(), m, raw) is None
    (art / CARD_NAME).write_bytes(card.readme)
    assert [p.path for p in verify_artifact(art).problems] == [CARD_NAME]  # a README without its record: extra
    (art / CARD_RECORD_NAME).write_bytes(card.record_bytes)
    report = verify_artifact(art)
    assert report.ok and report.published_as == REPO and CARD_NAME in report.companions
    assert report.root_digest == m.root_digest  # the card is outside the hashed set
    (art / CARD_NAME).write_bytes(card.readme.replace(b"+1.41%", b"+0.01%") + b"edited\n")
    assert [(p.path, p.status) for p in verify_artifact(art).problems] == [(CARD_NAME, "card")]
    forged = {**card.record.to_json(), "root_digest": "0" * 64}
    (art / CARD_RECORD_NAME).write_text(json.dumps(forged))  # a record of another artifact vouches for nothing
    assert [(p.path, p.status) for p in verify_artifact(art).problems] == [
        (CARD_NAME, "extra"),
        (CARD_RECORD_NAME, "card"),
    ]


def test_a_card_record_cannot_vouch_for_a_file_vllm_would_load(tmp_path: Path) -> None:
    from qwenquant.hashing import seal

    art = _artifact(tmp_path)
    card, _, raw = _card(art)
    body = {k: v for k, v in card.record.to_json().items() if k != "card_self_digest"}
    body["files"] = {**body["files"], "chat_template.jinja": {"size": 3, "sha256": "1" * 64}}
    why = card_record_problem(seal(body, "card_self_digest"), load_manifest(art), raw)
    assert why and "chat_template.jinja" in why


def test_two_served_configurations_are_two_card_lines_each_naming_its_own(tmp_path: Path) -> None:
    """A bf16 and an int8 served report (the second with flags after --) are two configurations, not one
    refused; each card line names the activations, profile and flags of the report it came from, and the
    machine column has one style for eval and bench rows."""
    from qwenquant.evaluate.report import served_kind
    from qwenquant.publish.figures import served_command

    art = _artifact(tmp_path)
    root = load_manifest(art).root_digest
    bf16 = {**_served_report(root), "served": {**_served_report(root)["served"], "activations": "bf16"}}
    int8 = {
        **_served_report(root),
        "served": {**bf16["served"], "activations": "int8", "extra_vllm_flags": ["--max-model-len", "4096"]},
    }
    int8["mtp"] = {**int8["mtp"], "mean_acceptance_length": 2.3}
    _write(report_path(art, root, served_kind("bf16", "single-user", [])), bf16)
    _write(report_path(art, root, served_kind("int8", "single-user", ["--max-model-len", "4096"])), int8)
    bench = _write(tmp_path / "bench.json", _bench_report(root))
    card, reps, _ = _card(art, [bench])
    published = {r.repo_path: r.data for r in reps}
    lines = [f for f in card.record.to_json()["figures"] if f["label"] == "mean acceptance length"]
    assert sorted(f["text"] for f in lines) == ["2.300", "2.500"]
    for f in lines:  # each line's configuration is its own report's
        served = published[f["source"]]["served"]
        flags = served.get("extra_vllm_flags") or []
        assert f["command"] == served_command(served["profile"], served["activations"], flags, "tiny-reference")
        assert f"--activations {served['activations']}" in f["command"]
    int8_line = next(f for f in lines if f["text"] == "2.300")
    assert int8_line["command"].endswith("--activations int8 -- --max-model-len 4096")
    machines = {f["section"]: f["machine"] for f in card.record.to_json()["figures"] if f["machine"]}
    assert machines["throughput"] == "NVIDIA GeForce RTX 4090, vLLM 0.19.1"
    assert machines["MTP acceptance (served)"] == "cuda, --gpu-mem 24GiB, vLLM 0.19.1"


def test_the_use_it_command_starts_a_model_shorter_than_the_profile(tmp_path: Path) -> None:
    """A model of 4,096 positions (the tiny one): `serve --profile single-user` alone is refused (32,768),
    so the card's command carries `-- --max-model-len 4096`, as the plain vLLM line beside it does."""
    art = _artifact(tmp_path)
    cfg = json.loads((art / "config.json").read_text())
    (art / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 4096}))
    recipe = load_recipe("w4a16-int4head").canonical()
    write_manifest(
        art,
        build_manifest(
            art,
            source=SOURCE,
            recipe=recipe,
            recipe_sha256=sha256_json(recipe),
            calibration=CALIBRATION,
            stages={},
            quality={},
            tool_versions={},
        ),
    )
    text = _card(art)[0].readme.decode()
    assert "qwenquant serve models/Qwen3.8-27B-w4a16 --profile single-user -- --max-model-len 4096\n" in text
    assert "--max-model-len 4096" in text.split("Plain vLLM", 1)[1]


@pytest.mark.parametrize(
    "mode, edit, said",
    [
        ("depth", {"last_ok_depth": 999999}, "last_ok_depth is 999999, but its own records give 1983"),
        ("soak", {"verdict": "ok"}, 'verdict is "ok", not an object with a `status` string'),
    ],
)
def test_a_hand_edited_long_report_is_refused_naming_the_field(
    tmp_path: Path, mode: str, edit: dict, said: str
) -> None:
    art = _artifact(tmp_path)
    root = load_manifest(art).root_digest
    target = {
        "label": "t",
        "artifact_root_digest": root,
        "profile": "single-user",
        "device": "cpu",
        "vllm_version": "0.32.0",
    }
    body = {
        "tool": f"qwenquant bench {mode}",
        "schema_version": 1,
        "target": target,
        "max_model_len": 2048,
        "concurrency": 1,
        "argv": ["qwenquant", "bench", mode],
    }
    body |= (
        {
            "rungs": [{"prompt_tokens": 991, "ok": True}, {"prompt_tokens": 1983, "ok": True}],
            "last_ok_depth": 1983,
            "failure": None,
        }
        if mode == "depth"
        else {"soak_tokens": 200, "verdict": {"status": "ok"}, "windows": []}
    )
    good = _write(tmp_path / "good.json", body)
    assert len(_card(art, [good])[1]) == 1
    bad = _write(tmp_path / "bad.json", {**body, **edit})
    with pytest.raises(UsageError, match="the report was edited") as e:
        _card(art, [bad])
    assert f"report {bad}: {said}" in str(e.value)


def test_versioned_eval_reports_are_read_typed_and_a_wrong_leaf_is_refused(tmp_path: Path) -> None:
    """Reports of schema_version 1 go on the card through their typed loaders: the figures are the typed
    report's, its command and machine its fields; a part edited to another type is refused naming its path."""
    from test_eval_report import documents

    from qwenquant.evaluate.report import OfflineReport, ServedReport

    art = _artifact(tmp_path)
    root = load_manifest(art).root_digest
    offline = {**documents()["offline-text-set"], "root_digest": root}
    served = documents()["served-everything"]
    served = {**served, "root_digest": root, "served": {**served["served"], "artifact_root_digest": root}}
    _write(report_path(art, root, "eval"), offline)
    _write(report_path(art, root, "eval-served"), served)
    card, reps, _ = _card(art)
    assert [type(r.typed) for r in reps] == [OfflineReport, ServedReport]
    figures = {f["label"]: f for f in card.record.to_json()["figures"]}
    assert figures["perplexity vs bf16 source"]["text"] == "+0.36%"
    assert figures["perplexity vs bf16 source"]["machine"] == "cuda, dense forward"
    assert figures["task copy: exact-match passed"]["text"] == "5/5 (needs 5)"
    assert figures["task copy: exact-match passed"]["machine"] == "cpu, vLLM 0.32.0"
    bad = _write(tmp_path / "bad.json", {**offline, "mtp": {**offline["mtp"], "change_pct": "0.04"}})
    with pytest.raises(UsageError, match=r"^report .*bad\.json: mtp\.change_pct is \"0\.04\""):
        _card(art, [bad])
