"""The model as torch pieces, shared by quantize and eval: the text model rebuilt from its shards
one piece at a time (text.py), the MTP draft head (mtp.py), int4 rounding and lm_head quality
figures (head_quality.py)."""
