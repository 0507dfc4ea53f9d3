"""`qwenquant quantize`: the stage pipeline, its records, the stages and the layer-streamed GPTQ engine.

    pipeline.py   the loop over a stage list; the only writer of stage records and the manifest
    stage.py      the stage interface (Stage, StageContext): what a stage declares, what it reads
    records.py    stage completion records: when a stage may be skipped
    status.py     `quantize --plan`: which stages would run or be reused, and why (reads only)
    stages/       one module per stage, in pipeline order (stages/__init__.py)
    graft.py      `qwenquant graft-mtp`, around the mtp stage's functions
    engine/       the layer-streamed GPTQ engine the gptq stage runs (also N processes)
    oneshot.py    the gptq stage's other engine: llm-compressor's whole-model oneshot, saved compressed
    head_gptq.py  GPTQ of the lm_head as tensor functions

llm-compressor and compressed-tensors are reached only through modeling/compat.py.
"""
