"""Quantize stages, one module per stage; `qwenquant.pipeline` runs them in this order.

    source       stages/source.py       verify the fetched model (or hash a local one)
    calibration  stages/calibration.py  text -> token ids + fingerprint
    gptq         stages/gptq.py         llm-compressor GPTQ, unquantized tensors restored from source bytes
    lm_head      stages/headquant.py    activation-calibrated int4 head (math: stages/lm_head.py)
    mtp          stages/mtp.py          bf16 MTP head grafted byte-identical (also `qwenquant graft-mtp`)
    textonly     stages/textonly.py     Qwen3_5ForCausalLM layout for vLLM (or keep multimodal)
    check        pipeline + check.py    vLLM load rules and the byte-identity proof (stages/identity.py)

Helpers: tensorfile.py (raw safetensors IO), assemble.py (derive a folder from the previous
stage's, hard-linking what is unchanged), records.py (completion records).
"""

STAGES = ("source", "calibration", "gptq", "lm_head", "mtp", "textonly", "check")
