"""The model as torch pieces, shared by quantize and eval: the text model rebuilt from its shards
one piece at a time (text.py), the MTP draft head (mtp.py), int4 rounding and lm_head quality
figures (int4.py, head_quality.py), the device resolver and determinism switches (runtime.py),
and the one door to llm-compressor and compressed-tensors internals (compat.py)."""
