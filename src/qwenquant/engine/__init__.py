"""The layer-streamed GPTQ engine: the 27B quantized with one decoder layer in memory at a time.

    model.py     the text model around the layers, rebuilt from the source shards piece by piece
    quantize.py  GPTQ for one layer with llm-compressor's own functions, packed by compressed-tensors
    layers.py    per-layer completion records (resume after a crash, verified by content)
    run.py       the layer loop; lm_head calibration from the same pass
    headcal.py   the lm_head calibration files the lm_head stage reads
    stage.py     the gptq stage on this engine: output shards, config, identity proof

`QWENQUANT_GPTQ_ENGINE=oneshot` selects the previous whole-model llm-compressor `oneshot` path.
"""
