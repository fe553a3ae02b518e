"""An emulated network, so a laptop can show what a cluster network does.

Each message of n bytes from i to j, sent at time s over a link of latency L and
bandwidth B (``links[(i, j)]`` or the defaults), costs the source notes' formula
*communication time = complexity / bandwidth + latency*, on both ends of the wire:

* **the sender's uplink** is busy for the transmission time n / B (the sender's ``send``
  returns at s + n / B, as a network card would let it), and the message cannot reach
  j before ``ready_at = s + n / B + L``;
* **the receiver's downlink** takes one message at a time, n / B each: j keeps the time
  ``free`` at which its downlink is free again, and delivers the message at

      delivered = max(ready_at, free + n / B),    then    free = delivered.

  A lone message is delivered at ``ready_at``, and so are the messages of one sender
  (its uplink already spaced them n / B apart). But p workers sending n bytes each to
  one server at the same time now take L + p * n / B, not L + n / B: **incast**, the
  bottleneck of every gather, reduce and parameter server.

The approximation: the receiver serialises the messages in the order it *reads* them
from its Pipes, not in the order they reached it; a receiver that reads a late message
before an earlier one makes the earlier one wait behind it. ``Network(downlink=False)``
charges the sender only (the model without incast, for comparison).

Per-link values override the defaults: ``links={(0, 1): (latency, bandwidth)}``
(a link given one way applies both ways unless the other way is given too).
``Network()`` is instant: no cost at all, and the clock is not even read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Network:
    latency: float = 0.0  # seconds per message
    bandwidth: float = math.inf  # bytes per second
    links: dict = field(default_factory=dict)
    downlink: bool = True  # the receiver's link serialises what it receives (incast); False: sender only

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


class Downlink:
    """One rank's receiving link: delivers messages one after the other (see the module doc)."""

    def __init__(self):
        self.free = -math.inf  # when the last message taken has been delivered

    def deliver(self, ready_at: float, transmit: float) -> float:
        """The delivery time of a message the sender's side makes ready at ``ready_at`` and
        whose ``transmit`` = n / B seconds the downlink must also spend on it."""
        self.free = max(ready_at, self.free + transmit)
        return self.free


def _check(latency, bandwidth, what):
    if not (isinstance(latency, (int, float)) and latency >= 0 and math.isfinite(latency)):
        raise ValueError(f"latency of {what} must be a finite number >= 0 seconds, got {latency!r}")
    if not (isinstance(bandwidth, (int, float)) and bandwidth > 0):
        raise ValueError(f"bandwidth of {what} must be > 0 bytes/second, got {bandwidth!r}")
