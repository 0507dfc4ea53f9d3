"""Train the tiny reference model: Qwen3.5 text stack + jointly trained MTP head on Python stdlib sources.

The offline tool that made the committed `src/qwenquant/data/tiny-reference/` (not part of the package).
`python scripts/train_reference.py --out DIR [--device cpu|cuda] [--steps N]` writes DIR/model.safetensors
(bf16, checkpoint tensor names: `model.language_model.*`, `lm_head.weight`, the 15 `mtp.*`),
tokenizer.json, heldout.safetensors (the evaluation windows), reference.json (dims, corpus
digest, Python/torch versions, training settings, measured losses) and SHA256SUMS.

Deterministic: one seed for init, one generator for batches, one CPU thread by default (so the
result does not depend on the machine's core count, and a shared machine loses nothing to thread
synchronisation). On CPU with the same torch build, machine type and `--threads`, a rerun writes
byte-identical weights; another thread count or a GPU changes float summation order, hence the
low bits and (after rounding to bf16) some weights and the figures in their last digits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from qwenquant.testbed.tiny import config, tokenizer
from qwenquant.testbed.tiny.config import TinyDims

import stdlib_corpus  # scripts/stdlib_corpus.py, beside this file

# Every quantized width a multiple of 128 (group-128 int4 along the input dim; vLLM's CPU kernel
# needs multiples of 32 on both sides): hidden 256, MLP 768, q 512, kv 128, GDN qkv 512 / z 256.
DIMS = TinyDims(hidden=256, intermediate=768, vocab=4096)
BPE_VOCAB = DIMS.vocab - len(tokenizer.ADDED_TOKENS)  # 4070 + 26 added tokens = 4096 rows
LM = "model.language_model"


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0
    steps: int = 200
    batch: int = 8
    seq: int = 256
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.01
    mtp_weight: float = 0.3
    threads: int = 1
    heldout_windows: int = 64


def encode(tokenizer_text: str, docs: tuple[str, ...]) -> torch.Tensor:
    """Token ids of `docs` joined by `<|endoftext|>`, one int64 stream."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_text)
    eot = tok.token_to_id(stdlib_corpus.SEPARATOR)
    ids: list[int] = []
    for enc in tok.encode_batch(list(docs), add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def heldout_windows(stream: torch.Tensor, windows: int, length: int) -> torch.Tensor:
    """`windows` non-overlapping windows of `length` tokens from the start of `stream` [windows, length]."""
    if stream.numel() < windows * length:
        raise ValueError(f"held-out text has {stream.numel()} tokens, fewer than {windows} x {length}")
    return stream[: windows * length].reshape(windows, length).clone()


def build_models(tokenizer_text: str, seed: int) -> tuple[Any, Any]:
    """(Qwen3_5ForCausalLM, MTPHead) with seeded initial weights, fp32."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from qwenquant.modeling.mtp import MTPHead

    text = Qwen3_5TextConfig(**config.model_config(DIMS, tokenizer_text)["text_config"])
    text._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(text).float()
    mtp = MTPHead(text).float()
    with torch.no_grad():  # transformers inits the trunk; give the MTP linears the same N(0, 0.02)
        for name, p in mtp.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, text.initializer_range)
            elif "norm" in name:
                p.zero_()  # offset norms: x * (1 + 0)
    return model, mtp


def losses(model: Any, mtp: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Next-token loss, MTP (t+2) loss, and MTP agreement with the target's greedy t+2 token, on ids [B, S+1]."""
    x = ids[:, :-1]
    hidden = model.model(input_ids=x).last_hidden_state  # post final norm: what vLLM hands the drafter
    logits = model.lm_head(hidden)
    main = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    emb_next = model.model.embed_tokens(x[:, 1:])
    mtp_logits = model.lm_head(mtp(emb_next, hidden[:, :-1]))
    draft = F.cross_entropy(mtp_logits.flatten(0, 1), ids[:, 2:].flatten())
    agree = (mtp_logits.argmax(-1) == logits[:, 1:].argmax(-1)).float().mean()
    return {"loss": main, "mtp_loss": draft, "mtp_agree": agree}


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup, cosine decay to 10%."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: Any, mtp: Any, windows: torch.Tensor, device: str, batch: int = 16) -> dict[str, float]:
    """Mean held-out loss, MTP loss and MTP agreement over `windows` [N, L]."""
    model.eval(), mtp.eval()
    sums: dict[str, float] = {}
    for i in range(0, windows.shape[0], batch):
        part = losses(model, mtp, windows[i : i + batch].to(device))
        for k, v in part.items():
            sums[k] = sums.get(k, 0.0) + float(v) * windows[i : i + batch].shape[0]
    model.train(), mtp.train()
    return {k: v / windows.shape[0] for k, v in sums.items()}


def train(s: TrainSettings, device: str, log: Any = print) -> dict[str, Any]:
    """Train; return {tensors: bf16 under checkpoint names, tokenizer: tokenizer.json text,
    heldout: evaluation windows, meta: settings, corpus digest and the measured figures}."""
    torch.set_num_threads(s.threads)
    corpus = stdlib_corpus.load_corpus()
    tok_text = tokenizer.train_tokenizer_json(list(corpus.train), BPE_VOCAB)
    stream = encode(tok_text, corpus.train)
    held = heldout_windows(encode(tok_text, corpus.heldout), s.heldout_windows, s.seq + 1)
    model, mtp = build_models(tok_text, s.seed)
    model.to(device), mtp.to(device)
    params = list(model.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=s.lr, betas=(0.9, 0.95), weight_decay=s.weight_decay)
    gen = torch.Generator().manual_seed(s.seed + 1)
    start, last = time.monotonic(), {}
    for step in range(s.steps):
        starts = torch.randint(0, stream.numel() - s.seq - 1, (s.batch,), generator=gen)
        ids = torch.stack([stream[i : i + s.seq + 1] for i in starts.tolist()]).to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        out = losses(model, mtp, ids)
        opt.zero_grad(set_to_none=True)
        (out["loss"] + s.mtp_weight * out["mtp_loss"]).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        last = {k: v.item() for k, v in out.items()}
        if step % 20 == 0 or step == s.steps - 1:
            log(
                f"step {step:4d}  loss {last['loss']:.3f}  mtp {last['mtp_loss']:.3f}  "
                f"agree {last['mtp_agree']:.3f}  {time.monotonic() - start:.0f}s"
            )
    seconds = time.monotonic() - start
    held_metrics = evaluate(model, mtp, held, device)
    tensors = checkpoint_tensors(model, mtp)
    meta = {
        "dims": asdict(DIMS),
        "settings": asdict(s),
        "device": device,
        "python": corpus.python,
        "corpus_sha256": corpus.digest(),
        "torch": torch.__version__,
        "modules": list(stdlib_corpus.MODULES),
        "heldout_modules": list(stdlib_corpus.HELDOUT),
        "train_tokens": int(stream.numel()),
        "train_seconds": round(seconds, 1),
        "final_train": last,
        "heldout": held_metrics,
        "heldout_ppl": math.exp(held_metrics["loss"]),
    }
    return {"tensors": tensors, "tokenizer": tok_text, "heldout": held, "meta": meta}


def checkpoint_tensors(model: Any, mtp: Any) -> dict[str, torch.Tensor]:
    """The trained weights under the Qwen3.5 checkpoint's names, bf16, contiguous, on the CPU."""
    out = {}
    for k, v in model.state_dict().items():
        name = "lm_head.weight" if k == "lm_head.weight" else f"{LM}.{k[len('model.') :]}"
        out[name] = v
    out.update({f"mtp.{k}": v for k, v in mtp.state_dict().items()})
    return {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in sorted(out.items())}


def write_outputs(out_dir: Path, result: dict[str, Any]) -> None:
    """model.safetensors, tokenizer.json, heldout.safetensors, reference.json and SHA256SUMS into `out_dir`."""
    from safetensors.torch import save

    from qwenquant.atomic import atomic_write_bytes, pretty_json, staging_dir

    files = {
        "model.safetensors": save(result["tensors"], metadata={"format": "pt"}),
        "tokenizer.json": result["tokenizer"].encode(),
        "heldout.safetensors": save({"input_ids": result["heldout"].to(torch.int32)}),
        "reference.json": pretty_json(result["meta"]),
    }
    sums = "".join(f"{hashlib.sha256(b).hexdigest()}  {n}\n" for n, b in sorted(files.items()))
    with staging_dir(Path(out_dir)) as tmp:
        for name, data in files.items():
            atomic_write_bytes(tmp / name, data)
        atomic_write_bytes(tmp / "SHA256SUMS", sums.encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/train_reference.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=TrainSettings.steps)
    parser.add_argument("--threads", type=int, default=TrainSettings.threads)
    args = parser.parse_args(argv)
    settings = TrainSettings(steps=args.steps, threads=args.threads)
    result = train(settings, args.device, log=lambda m: print(m, file=sys.stderr, flush=True))
    write_outputs(args.out, result)
    print(json.dumps({k: result["meta"][k] for k in ("train_seconds", "final_train", "heldout", "heldout_ppl")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
