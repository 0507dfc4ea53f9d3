"""SM clock, power and throttle reasons sampled by `nvidia-smi -lms` while the benchmark runs.

A clock that drops under a power or thermal cap makes one configuration look slower than it is;
the run is flagged when a throttle reason other than idle / application clocks shows up.
Without nvidia-smi the result says "not sampled".
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass

from qwenquant.bench.parts import GpuMemory, GpuPeak, Range
from qwenquant.bench.runparts import GpuClocks

QUERY = "timestamp,index,name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # new name, old name
# nvml clocks event reason bits that mean the GPU ran slower than it could
THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
INTERVAL_MS = 200


def _num(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


@dataclass(frozen=True)
class GpuSample:
    """One nvidia-smi row: the GPU's index and name, SM clock and its maximum, power and its limit, the
    temperature (None: nvidia-smi had no value), and the clock event reasons' bits."""

    gpu: str
    name: str
    sm_mhz: float | None
    sm_max_mhz: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None
    reasons: int


def parse_samples(text: str) -> list[GpuSample]:
    """Rows of `nvidia-smi --format=csv,noheader,nounits` for QUERY + a reasons field (pure)."""
    rows = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) != 9:
            continue
        try:
            reasons = int(f[8], 16) if f[8].lower().startswith("0x") else int(f[8])
        except ValueError:
            reasons = 0
        rows.append(GpuSample(f[1], f[2], _num(f[3]), _num(f[4]), _num(f[5]), _num(f[6]), _num(f[7]), reasons))
    return rows


def summarize(rows: list[GpuSample]) -> GpuClocks:
    """Clock and power ranges, throttle reasons seen, and the share of samples throttled (pure)."""
    if not rows:
        return GpuClocks(sampled=False, why="nvidia-smi gave no samples")
    seen: dict[str, int] = {}
    throttled = 0
    for r in rows:
        names = [n for bit, n in THROTTLE_BITS.items() if r.reasons & bit]
        throttled += bool(names)
        for n in names:
            seen[n] = seen.get(n, 0) + 1
    clocks = [r.sm_mhz for r in rows if r.sm_mhz is not None]
    power = [r.power_w for r in rows if r.power_w is not None]
    return GpuClocks(
        sampled=True,
        samples=len(rows),
        gpu_name=rows[0].name,
        interval_ms=INTERVAL_MS,
        sm_mhz=_range(clocks),
        sm_max_mhz=rows[0].sm_max_mhz,
        power_w=_range(power),
        power_limit_w=rows[0].power_limit_w,
        max_temp_c=max((r.temp_c or 0) for r in rows),
        throttle_reasons=seen,
        throttled_fraction=throttled / len(rows),
        throttled=throttled > 0,
    )


def _range(v: list[float]) -> Range | None:
    return Range(min=min(v), median=statistics.median(v), max=max(v)) if v else None


class GpuSampler:
    """`with GpuSampler() as s: ...` then `s.result` (the summary, or not sampled and why)."""

    def __init__(self, interval_ms: int = INTERVAL_MS) -> None:
        self.interval_ms = interval_ms
        self.result = GpuClocks(sampled=False, why="not sampled: nvidia-smi not found")
        self._proc: subprocess.Popen | None = None
        self._out = tempfile.TemporaryFile()

    def __enter__(self) -> GpuSampler:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return self
        why = ""
        for reasons in REASON_FIELDS:
            try:
                probe = subprocess.run(
                    [exe, f"--query-gpu={QUERY},{reasons}", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            except (OSError, subprocess.SubprocessError) as e:
                why = str(e)
                break
            why = probe.stderr.strip()[:200]
            if probe.returncode == 0:
                self._proc = subprocess.Popen(
                    [
                        exe,
                        f"--query-gpu={QUERY},{reasons}",
                        "--format=csv,noheader,nounits",
                        "-lms",
                        str(self.interval_ms),
                    ],
                    stdout=self._out,
                    stderr=subprocess.DEVNULL,
                )
                return self
        self.result = GpuClocks(sampled=False, why=f"not sampled: nvidia-smi failed: {why}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            _stop(self._proc)
            self._out.seek(0)
            self.result = summarize(parse_samples(self._out.read().decode(errors="replace")))
        self._out.close()


def gpu_name() -> str | None:
    """Name of GPU 0, or None without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def _stop(proc: subprocess.Popen) -> None:
    """End an nvidia-smi sampler: SIGTERM, then SIGKILL after 10 s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


MEMORY_QUERY = "index,memory.used,memory.total,memory.free"
MEMORY_INTERVAL_MS = 100


def parse_memory(text: str) -> GpuMemory:
    """Peak memory of `nvidia-smi --query-gpu=index,memory.used,memory.total,memory.free` rows (pure):
    per GPU the most used and the least free, in MiB; not sampled without a readable row.
    `min_free_mib` is nvidia-smi's own free column: total minus used would also count the memory the
    driver reserves (about 615 MiB of an idle H200's 143,771 MiB), which no process can have."""
    peak: dict[str, GpuPeak] = {}
    for line in text.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) != 4:
            continue
        used, total, free = _num(f[1]), _num(f[2]), _num(f[3])
        if used is None or total is None or free is None:
            continue
        p = peak.get(f[0]) or GpuPeak(peak_used_mib=used, total_mib=total, min_free_mib=free, samples=0)
        peak[f[0]] = GpuPeak(
            peak_used_mib=max(p.peak_used_mib, used),
            total_mib=p.total_mib,
            min_free_mib=min(p.min_free_mib, free),
            samples=p.samples + 1,
        )
    if not peak:
        return GpuMemory(sampled=False, why="not sampled: nvidia-smi gave no memory samples")
    return GpuMemory(
        sampled=True,
        interval_ms=MEMORY_INTERVAL_MS,
        gpus=peak,
        peak_used_mib=max(p.peak_used_mib for p in peak.values()),
    )


class MemoryPeak:
    """`with MemoryPeak() as m: ...` then `m.result`: the GPU memory peak over the block (nvidia-smi
    sampled every 100 ms; "not sampled" without it). Under a hard --gpu-mem the ballast's memory counts
    as used, so `min_free_mib` is the headroom the server had left."""

    def __init__(self) -> None:
        self.result = GpuMemory(sampled=False, why="not sampled: nvidia-smi not found")
        self._proc: subprocess.Popen | None = None
        self._out = tempfile.TemporaryFile()

    def __enter__(self) -> MemoryPeak:
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            try:
                self._proc = subprocess.Popen(
                    [
                        exe,
                        f"--query-gpu={MEMORY_QUERY}",
                        "--format=csv,noheader,nounits",
                        "-lms",
                        str(MEMORY_INTERVAL_MS),
                    ],
                    stdout=self._out,
                    stderr=subprocess.DEVNULL,
                )
            except OSError as e:
                self.result = GpuMemory(sampled=False, why=f"not sampled: {e}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            time.sleep(MEMORY_INTERVAL_MS / 1000)  # at least one sample after the block's last work
            _stop(self._proc)
            self._out.seek(0)
            self.result = parse_memory(self._out.read().decode(errors="replace"))
        self._out.close()
