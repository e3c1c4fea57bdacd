"""One ``/metrics`` per pod when the pod runs several trainer ranks: local rank 0 serves its siblings' series too.

Why aggregation and not one port per rank: a pod is one scrape target everywhere users look (the PodMonitor, a
plain Prometheus's pod discovery and the suite's http_sd select the port named ``metrics``; the pod declares only
local rank 0's ports). So, as with a multi-process server behind one endpoint, local rank 0's ``/metrics`` is the
pod's: its own registry plus every sibling rank's ``/metrics`` (each rank still serves its own on its port block,
``port base + 10·l``), read over loopback at scrape time and merged family by family. Every series already
carries ``replica`` = the rank's *global* rank, so ranks stay apart (``kubeforge_step{role="trainer",replica="3"}``).

Neighbours: ``startup.pod_metrics`` builds :class:`Siblings` for local rank 0 of a multi-rank trainer pod and hands
it to ``metrics.MetricsServer`` (``siblings``); ``metrics`` renders the own registry.

Invariants:
- A scrape never waits longer than ``timeout_s`` per sibling, and a sibling that does not answer (still starting,
  gone) is left out of that scrape (its series go stale in Prometheus) and logged at most once per minute per
  sibling; rank 0's own series are always served.
- The merge keeps one HELP/TYPE per family (the text format allows a family once) and every sample of every rank.
"""
from __future__ import annotations

import concurrent.futures
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from typing import Any

import prometheus_client as prom
from prometheus_client.parser import text_string_to_metric_families

from kubeforge.api import contract


def sibling_urls(*, host: str, pod_port_base: int, ranks: int) -> list[str]:
    """``/metrics`` of local ranks 1..ranks-1 of a pod whose rank 0 has ``pod_port_base``, over ``host``."""
    host = f"[{host}]" if ":" in host else host
    return [f"http://{host}:{pod_port_base + r * contract.PORTS_PER_PROCESS + contract.PORT_METRICS}/metrics"
            for r in range(1, ranks)]


class _Families:
    """A registry-like object (``collect``) over already parsed families, for ``prom.generate_latest``."""

    def __init__(self, families: Iterable[Any]) -> None:
        self._families = list(families)

    def collect(self) -> list[Any]:
        return self._families


def merge(expositions: Sequence[bytes]) -> bytes:
    """One text exposition holding every sample of ``expositions``, one block per family (first HELP wins)."""
    families: dict[str, Any] = {}
    for text in expositions:
        for fam in text_string_to_metric_families(text.decode("utf-8", "replace")):
            have = families.get(fam.name)
            if have is None:
                families[fam.name] = fam
            else:
                have.samples.extend(fam.samples)
    return prom.generate_latest(_Families(families.values()))


class Siblings:
    """Reads the sibling ranks' ``/metrics`` at scrape time (concurrently, each bounded by ``timeout_s``)."""

    def __init__(self, urls: Sequence[str], *, timeout_s: float = 2.0, log_every_s: float = 60.0) -> None:
        self.urls = list(urls)
        self.timeout_s = timeout_s
        self.log_every_s = log_every_s
        self._logged: dict[str, float] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(self.urls)),
                                                           thread_name_prefix="sibling-metrics")

    def _one(self, url: str) -> bytes | None:
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:  # noqa: S310 - loopback http only
                body: bytes = resp.read()
                return body
        except (OSError, ValueError) as exc:
            now = time.monotonic()
            if now - self._logged.get(url, -self.log_every_s) >= self.log_every_s:
                self._logged[url] = now
                print(f"pod metrics: {url} not read ({exc}); its series are left out of this scrape",
                      file=sys.stderr, flush=True)
            return None

    def scrape(self) -> list[bytes]:
        """The expositions of the siblings that answered."""
        return [b for b in self._pool.map(self._one, self.urls) if b is not None]

    def render(self, own: bytes) -> bytes:
        """``own`` merged with every sibling that answered (``own`` alone when none did)."""
        others = self.scrape()
        return merge([own, *others]) if others else own

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
