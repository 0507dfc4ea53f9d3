"""Quantization math as pure tensor functions: the activation-calibrated lm_head GPTQ
(head_gptq.py) and its quality report against the original head (head_quality.py)."""
