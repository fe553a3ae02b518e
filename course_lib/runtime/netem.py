"""An emulated network, so a laptop can show what a cluster network does.

Each message from i to j costs ``latency + nbytes / bandwidth`` seconds, the seeds'
formula *communication time = complexity / bandwidth + latency*:

* the sender is busy for the transmission time ``nbytes / bandwidth`` (its link is
  occupied, as a network card would be);
* the receiver cannot see the message before ``send_start + transmission + latency``.

Per-link values override the defaults: ``links={(0, 1): (latency, bandwidth)}``
(a link given one way applies both ways unless the other way is given too).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Network:
    latency: float = 0.0  # seconds per message
    bandwidth: float = math.inf  # bytes per second
    links: dict = field(default_factory=dict)

    def __post_init__(self):
        _check(self.latency, self.bandwidth, "the network")
        for key, value in self.links.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ValueError(f"links keys must be (src, dst) pairs, got {key!r}")
            if not (isinstance(value, tuple) and len(value) == 2):
                raise ValueError(f"links[{key}] must be (latency, bandwidth), got {value!r}")
            _check(*value, f"link {key}")

    def link(self, src: int, dst: int) -> tuple[float, float]:
        if (src, dst) in self.links:
            return self.links[(src, dst)]
        if (dst, src) in self.links:
            return self.links[(dst, src)]
        return self.latency, self.bandwidth

    def cost(self, src: int, dst: int, nbytes: int) -> tuple[float, float]:
        """(transmission seconds, latency seconds) of one message."""
        latency, bandwidth = self.link(src, dst)
        return nbytes / bandwidth, latency

    @property
    def is_instant(self) -> bool:
        return self.latency == 0 and math.isinf(self.bandwidth) and not self.links


def _check(latency, bandwidth, what):
    if not (isinstance(latency, (int, float)) and latency >= 0 and math.isfinite(latency)):
        raise ValueError(f"latency of {what} must be a finite number >= 0 seconds, got {latency!r}")
    if not (isinstance(bandwidth, (int, float)) and bandwidth > 0):
        raise ValueError(f"bandwidth of {what} must be > 0 bytes/second, got {bandwidth!r}")
