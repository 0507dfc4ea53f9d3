"""`qwenquant bench`: a throughput probe for OpenAI-compatible servers whose figures survive an audit.

Stdlib HTTP only (no torch): streaming client (stream.py), pure rate arithmetic (rates.py),
Prometheus /metrics deltas (metrics.py), GPU clock sampling (gpu.py), the workload and its
shipped config (workload.py, data/), the run itself (runner.py), servers started through
qwenquant.serve (launch.py), and the JSON / table / PNG outputs (report.py, plot.py).
"""
