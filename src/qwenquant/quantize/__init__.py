"""`qwenquant quantize`: the stage pipeline, its records, the stages and the layer-streamed GPTQ engine.

    pipeline.py   the loop over the stages; the only writer of stage records and the manifest
    stage.py      the stage interface (Stage, StageContext)
    records.py    stage completion records: when a stage may be skipped
    stages/       one module per stage, in pipeline order (stages/__init__.py)
    engine/       the layer-streamed GPTQ engine the gptq stage runs (also N processes)
    head_gptq.py  GPTQ of the lm_head as tensor functions
"""
