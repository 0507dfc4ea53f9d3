"""The layer-streamed GPTQ engine: the 27B quantized with one decoder layer in memory at a time.

    model.py     the text model around the layers, rebuilt from the source shards piece by piece
    quantize.py  GPTQ for one layer with llm-compressor's own functions, packed by compressed-tensors
    layers.py    per-layer completion records (resume after a crash, verified by content)
    run.py       the layer loop; lm_head calibration from the same pass
    headcal.py   the lm_head calibration from the pass's final hidden states; its files the lm_head stage reads
    phases.py    wall seconds per phase of a layer (and of the parts after the loop)
    build.py     the gptq stage's folder on this engine: layer shards, the rest, index, head calibration
    ranks.py     `--gpus N`: rank count, calibration split, GPTQ owner per module (pure)
    dist.py      the collective steps inside one rank (Hessian reduce, gathers onto rank 0)
    launch.py    starts and watches the N rank processes; worker.py is one rank

The gptq stage (stages/gptq.py) runs it; `QWENQUANT_GPTQ_ENGINE=oneshot` selects llm-compressor's
whole-model `oneshot` instead. `QWENQUANT_MAX_GPU_MEM` (GiB) caps this engine's CUDA memory.
"""
