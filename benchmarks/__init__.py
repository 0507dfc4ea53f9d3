"""Scripts that measure qwenquant, run from the repository root as `python -m benchmarks.NAME` (README.md here).

They read the product through its commands and documented functions; what several of them share is in
`benchmarks/serving.py` (a `qwenquant serve` to ready and stopped, vLLM's kernel choice, Marlin forced on
Hopper) and `benchmarks/quantize_bench.py` (the GPU, the RSS sampler, the versions line).
"""
