"""Is the server still the one that was measured? A supervised server (`--serve`) is asked directly:
its process exited, a fatal line (out of memory, a dead engine) appeared in its log, or its ballast
died. Any server is asked over HTTP: /health must answer 200, and the API process's start time on
/metrics (`process_start_time_seconds`, exported by prometheus_client) must not change: a changed
start time is a restart between two looks, even one too quick for /health to miss."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from qwenquant.bench.parts import ServerHealth
from qwenquant.net.http import HttpError, fetch
from qwenquant.net.prometheus import samples

if TYPE_CHECKING:
    from qwenquant.serve.supervisor import Server

START_METRIC = "process_start_time_seconds"
EXIT_WAIT_S = 5.0


def process_start(page: str | None) -> float | None:
    """The smallest process start time on a /metrics page (the API server's), or None."""
    if not page:
        return None
    found = [v for name, _, v in samples(page) if name == START_METRIC]
    return min(found) if found else None


class ServerWatch:
    """`problem()` names what went wrong with the server since the watch began, or returns None."""

    def __init__(
        self, url: str, api_key: str | None = None, server: Server | None = None, first_page: str | None = None
    ) -> None:
        self.url, self.api_key, self.server = url.rstrip("/"), api_key, server
        self.started = process_start(first_page)

    def supervised(self) -> str | None:
        s = self.server
        if s is None:
            return None
        rc = s.proc.poll()
        if rc is not None:
            return f"the server process exited with code {rc}"
        if s.fatal:
            return f"the server log says: {s.fatal[1][:300]}"
        if s.ballast is not None and s.ballast.proc.poll() is not None:
            return f"the --gpu-mem ballast exited with code {s.ballast.proc.returncode}"
        return None

    def seen_page(self, page: str | None) -> str | None:
        """Check a /metrics page scraped for another reason: a changed process start time is a restart."""
        t = process_start(page)
        if t is None:
            return None
        if self.started is None:
            self.started = t
            return None
        if abs(t - self.started) > 1e-6:
            return f"the server restarted (its process start time moved from {self.started:.0f} to {t:.0f})"
        return None

    def problem(self) -> str | None:
        """The supervisor's view, then /health, then the process start time on /metrics."""
        why = self.supervised()
        if why:
            return why
        try:
            health = fetch(self.url + "/health", timeout=30.0)
            down = None if health.status == 200 else f"/health answered {health.status}"
        except HttpError as e:
            down = f"/health did not answer ({e.message})"
        if down:  # a supervised server that is going down: its exit code says more than /health
            deadline = time.monotonic() + EXIT_WAIT_S
            while self.server is not None and time.monotonic() < deadline:
                why = self.supervised()
                if why:
                    return why
                time.sleep(0.2)
            return down
        try:
            page = fetch(self.url + "/metrics", api_key=self.api_key, timeout=30.0)
        except HttpError:
            return None
        return self.seen_page(page.text if page.status == 200 else None)

    def info(self) -> ServerHealth:
        return ServerHealth(process_start_time=self.started, supervised=self.server is not None)
