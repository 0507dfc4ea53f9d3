"""The ballast: a process that holds a GPU's memory beyond `--gpu-mem SIZE`, so SIZE is a hard limit.

`qwenquant serve --gpu-mem 24GiB` on a bigger GPU starts `python -I ballast.py --size BYTES
--devices N` (under the watchdog, in a process group of its own) before vLLM. On each of the
first N devices CUDA exposes (the ones vLLM's workers take, CUDA_VISIBLE_DEVICES honoured) it
creates a CUDA context, then allocates device memory in chunks until exactly SIZE (to within a
2 MiB page) is left free: the ballast's own context counts in what it holds, so vLLM finds the
free memory of a SIZE card with nothing on it. It prints one line `ballast: {JSON}` (per device:
total, free before and after its context, held, free) and waits, holding, until it is stopped.
vLLM's memory profiling measures differences of free memory from its own start, so a ballast that
does not change is never counted as vLLM's memory; anything vLLM allocates beyond SIZE fails.

CUDA through the driver library (libcuda.so.1, which every NVIDIA driver installs) with ctypes:
no torch, standard library and qwenquant.envs only, so it runs isolated (-I) in qwenquant's own python.
`--probe`: create the context on device 0, print `ballast: {JSON}` (total, free) and exit, to
measure what a context costs. QWENQUANT_BALLAST_STANDIN=FILE (tests, no GPU): touch no GPU, hold
nothing, take the free memory from --free-before, and also write the report to FILE.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

# Run as a file under -I (no PYTHONPATH): the package this file belongs to is found from the file
# itself, so a source checkout used through PYTHONPATH works as an installed one does.
if not __package__:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from qwenquant import envs

MiB = 1024**2
PAGE = 2 * MiB  # cuMemAlloc's granularity
CHUNK = 1024 * MiB
STANDIN_ENV = "QWENQUANT_BALLAST_STANDIN"
REPORT = "ballast: "


class BallastError(Exception):
    """The ballast cannot leave SIZE free (too little free memory, no driver, an allocation refused)."""


def next_chunk(free: int, size: int, chunk: int = CHUNK, page: int = PAGE) -> int:
    """Bytes to allocate next so that `size` stays free: at most `chunk`, a whole number of pages,
    0 once less than a page above `size` is free."""
    excess = (free - size) // page * page
    return max(0, min(chunk, excess))


def planned_hold(free: int, size: int) -> int:
    """What the ballast will hold of `free` bytes to leave `size` (to within a page); BallastError when
    `free` is below `size`."""
    if free < size:
        raise BallastError(f"{free / 2**30:.2f} GiB free, less than the {size / 2**30:.2f} GiB to leave")
    return (free - size) // PAGE * PAGE


def ballast_command(python: str, size: int, devices: int, free_before: list[int] | None = None) -> list[str]:
    """The argv that runs the ballast for `devices` GPUs of `size` bytes each."""
    argv = [python, "-I", os.path.abspath(__file__), "--size", str(size), "--devices", str(devices)]
    if free_before:
        argv += ["--free-before", ",".join(str(f) for f in free_before)]
    return argv


class _Driver:
    """The few CUDA driver calls the ballast needs."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise BallastError(f"cannot load the CUDA driver (libcuda.so.1): {e}") from None
        self._check(self.lib.cuInit(0), "cuInit")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            raise BallastError(f"{what} failed: CUDA error {rc} ({(msg.value or b'?').decode()})")

    def use(self, ordinal: int) -> None:
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), f"cuDeviceGet({ordinal})")
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return free.value, total.value

    def alloc(self, n: int) -> None:
        ptr = ctypes.c_uint64()
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)), f"cuMemAlloc({n})")


def hold(driver: _Driver, ordinal: int, size: int) -> dict:
    """Leave `size` bytes free on device `ordinal` (its context included in what is held)."""
    driver.use(ordinal)
    free0, total = driver.mem_info()
    try:
        planned_hold(free0, size)
    except BallastError as e:
        raise BallastError(f"GPU {ordinal}: {e} (after the ballast's own CUDA context)") from None
    free, held = free0, 0
    while (n := next_chunk(free, size)) > 0:
        driver.alloc(n)
        held += n
        free, _ = driver.mem_info()
    return {"device": ordinal, "total": total, "free_after_context": free0, "held": held, "free": free}


def _standin(size: int, devices: int, free_before: list[int]) -> list[dict]:
    out = []
    for i in range(devices):
        free0 = free_before[i] if i < len(free_before) else size
        try:
            held = planned_hold(free0, size)
        except BallastError as e:
            raise BallastError(f"GPU {i}: {e}") from None
        out.append(
            {
                "device": i,
                "total": None,
                "free_after_context": free0,
                "held": held,
                "free": free0 - held,
                "standin": True,
            }
        )
    return out


def _args(argv: list[str]) -> dict:
    out: dict = {"size": 0, "devices": 1, "free_before": [], "probe": False}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--probe":
            out["probe"] = True
        elif a in ("--size", "--devices"):
            out[a[2:]] = int(argv[i + 1])
            i += 1
        elif a == "--free-before":
            out["free_before"] = [int(x) for x in argv[i + 1].split(",") if x]
            i += 1
        else:
            raise ValueError(f"unknown argument {a!r}")
        i += 1
    return out


def _report(report: dict) -> None:
    print(REPORT + json.dumps(report, sort_keys=True), flush=True)
    path = envs.get(STANDIN_ENV)
    if path:
        with open(path, "w") as f:
            json.dump(report, f)


def main(argv: list[str]) -> int:
    """Hold, report, wait for SIGTERM (exit 0); exit 1 with one `ballast: error ...` line when it cannot hold."""
    try:
        a = _args(argv)
    except (ValueError, IndexError) as e:
        print(f"ballast: usage error: {e}", file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # the driver frees everything at exit
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor stops it, last
    try:
        if envs.get(STANDIN_ENV):
            devices = _standin(a["size"], a["devices"], a["free_before"])
        else:
            driver = _Driver()
            if a["probe"]:
                driver.use(0)
                free, total = driver.mem_info()
                _report({"pid": os.getpid(), "probe": True, "total": total, "free": free})
                return 0
            devices = [hold(driver, i, a["size"]) for i in range(a["devices"])]
    except BallastError as e:
        print(f"ballast: error {e}", flush=True)
        return 1
    for d, before in zip(devices, a["free_before"], strict=False):
        d["free_before"] = before
        if not d.get("standin"):  # what the ballast's own context took, as the driver counts it
            d["context"] = before - d["free_after_context"]
    _report({"pid": os.getpid(), "size": a["size"], "devices": devices})
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
