"""A byte-level BPE tokenizer trained offline on `corpus.CORPUS`, with the Qwen special tokens.

Training with the `tokenizers` library is deterministic for a fixed corpus and vocab size (checked
across processes), so `tokenizer.json` has the same bytes on every build.
"""

from __future__ import annotations

import functools
from typing import Any

from qwenquant.testbed.tiny.corpus import CORPUS

# Same pre-tokenizer regex as the Qwen3.5 tokenizer, so transformers builds the same pipeline
# whether it reads tokenizer.json or rebuilds it from the tokenizer class.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# BPE vocab (256 bytes + merges) before the added tokens; with the 26 added tokens the total is
# 1018, padded to a 1024-row embedding.
BPE_VOCAB_SIZE = 992

# Added tokens in Qwen's order (their ids follow the BPE vocab, as in the real tokenizer).
# (content, special): the <|...|> markers are special; the tag-like ones are plain added tokens.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# ChatML, written for this project: string or list-of-parts content (text / image / video),
# add_generation_prompt, and enable_thinking=false giving an empty think block as Qwen3 does.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in part -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# A plain word the constant variant always predicts (a single token in the trained vocab).
CONSTANT_WORD = " the"


@functools.lru_cache(maxsize=1)
def tokenizer_json() -> str:
    """Train the tokenizer and return its `tokenizer.json` text (cached per process)."""
    return train_tokenizer_json([CORPUS], BPE_VOCAB_SIZE)


def train_tokenizer_json(texts: list[str], bpe_vocab_size: int) -> str:
    """Train a byte-level BPE of `bpe_vocab_size` (bytes + merges) on `texts`, append the Qwen added
    tokens (ids after the BPE vocab) and return the `tokenizer.json` text."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for content, special in ADDED_TOKENS:
        token = AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    return tok.to_str(pretty=True)


@functools.lru_cache(maxsize=4)
def token_ids(tokenizer_text: str | None = None) -> dict[str, int]:
    """Ids of every added token, plus `"constant"`: the id of `CONSTANT_WORD` (in `tokenizer_text`,
    a `tokenizer.json`; default the tiny tokenizer)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json() if tokenizer_text is None else tokenizer_text)
    found = {content: tok.token_to_id(content) for content, _ in ADDED_TOKENS}
    missing = sorted(content for content, i in found.items() if i is None)
    if missing:  # a tokenizer.json without the added tokens: no ids to put in the config
        raise RuntimeError(f"the tokenizer lacks the added tokens {missing}")
    ids = {content: i for content, i in found.items() if i is not None}
    word = tok.encode(CONSTANT_WORD, add_special_tokens=False).ids
    if len(word) != 1:  # a corpus edit would have to break this; fail loudly at build time
        raise RuntimeError(f"{CONSTANT_WORD!r} is {len(word)} tokens in the tiny vocab, expected 1")
    ids["constant"] = word[0]
    ids["size"] = tok.get_vocab_size(with_added_tokens=True)
    return ids


def tokenizer_config(tokenizer_text: str | None = None) -> dict[str, Any]:
    """`tokenizer_config.json`: Qwen2-style tokenizer class, special tokens, the chat template."""
    ids = token_ids(tokenizer_text)
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[content]): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for content, special in ADDED_TOKENS
        },
        "additional_special_tokens": [c for c, special in ADDED_TOKENS if special and c not in _NAMED_SPECIALS],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


_NAMED_SPECIALS = {"<|endoftext|>", "<|im_end|>"}
