"""Quantize stages, one module per stage, each exporting one `STAGE` (interface: quantize/stage.py).

`pipeline.quantize` runs `PIPELINE` in this order (`quantize --plan`, status.py, says which would run):

    source       stages/source.py       verify the fetched model (or hash a local one)
    calibration  stages/calibration.py  text -> token ids + fingerprint
    gptq         stages/gptq.py         GPTQ layer by layer (engine/), or llm-compressor oneshot + restore
    lm_head      stages/lm_head.py      activation-calibrated int4 head (math: quantize/head_gptq.py),
                                        calibrated from the gptq stage's head-calibration/
    mtp          stages/mtp.py          bf16 MTP head grafted byte-identical (`qwenquant graft-mtp`: graft.py)
    textonly     stages/textonly.py     Qwen3_5ForCausalLM layout for vLLM (or keep multimodal)
    check        stages/check.py        vLLM load rules and the byte-identity proofs
    eval         stages/eval.py         the recipe's quick eval (`eval:` key), figures for the manifest

Reading and writing checkpoints lives in qwenquant/checkpoint/, stage records in quantize/records.py.
"""

from qwenquant.quantize.stages import calibration, check, eval, gptq, lm_head, mtp, source, textonly

PIPELINE = (
    source.STAGE,
    calibration.STAGE,
    gptq.STAGE,
    lm_head.STAGE,
    mtp.STAGE,
    textonly.STAGE,
    check.STAGE,
    eval.STAGE,
)
