"""A server that dies while starting: the error names the engine's own exception, not the API server's wrapper."""

from __future__ import annotations

from qwenquant.serve.failure import root_cause

# the shape of vLLM 0.26's log when its engine core fails during start-up (abridged)
LOG = [
    "(EngineCore pid=4540) INFO 12-02 06:59:58 [gpu_worker.py:436] Available KV cache memory: 4.41 GiB",
    "(EngineCore pid=4540) ERROR 12-02 06:59:59 [core.py:1093] EngineCore failed to start.",
    "(EngineCore pid=4540) ValueError: To serve at least one request with the models max seq len (122880), "
    "(4.62 GiB KV cache is needed, which is larger than the available KV cache memory (4.41 GiB).",
    '(APIServer pid=4537)   File "vllm/v1/engine/utils.py", line 1272, in wait_for_engine_startup',
    "(APIServer pid=4537) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
]


def test_the_engines_exception_is_the_cause() -> None:
    assert root_cause(LOG) == LOG[2].split(") ", 1)[1]


def test_only_the_wrapper_or_nothing_gives_no_cause() -> None:
    assert root_cause(LOG[-1:]) is None
    assert root_cause(LOG[:2]) is None


def test_a_warning_that_quotes_an_exception_is_not_the_cause() -> None:
    """vLLM 0.26 on a GPU host: its ulimit warning quotes an OSError long before the engine's own
    failure (the shape of the lines a hard --gpu-mem start printed, abridged)."""
    log = [
        "(APIServer pid=5801) WARNING 12-02 11:03:23 [system_utils.py:299] Found ulimit of 20000 and failed to "
        "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
        "like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n",
        "(EngineCore pid=5923) ERROR 12-02 11:03:41 [core.py:1330]     raise ValueError(",
        "(EngineCore pid=5923) ERROR 12-02 11:03:41 [core.py:1330] ValueError: Free memory on device cuda:0 "
        "(23.49/139.8 GiB) on startup is less than desired GPU memory utilization (0.18, 25.16 GiB).",
        "(APIServer pid=5801) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    assert root_cause(log) == (
        "ValueError: Free memory on device cuda:0 (23.49/139.8 GiB) on startup is less than "
        "desired GPU memory utilization (0.18, 25.16 GiB)."
    )
