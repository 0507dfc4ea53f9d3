"""`qwenquant eval`: what quantization cost, measured against the source model.

offline: paired perplexity / KL / top-1 of an artifact against its bf16 source on fixed held-out
windows, both through one torch forward over dequantized weights (`forward.DenseForward`; a
layer-streamed forward with the same `final_hidden` method can replace it for models that do
not fit in memory). served: an exact-match gate through a running server's OpenAI API plus MTP
acceptance from vLLM's /metrics counters.
"""
