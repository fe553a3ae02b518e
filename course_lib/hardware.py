"""Published figures of real hardware: links, memory and accelerators, in one table.

Lessons 00 and 07 show this table next to what they measure on a laptop, and the named
presets of the alpha-beta cost model (:data:`course_lib.costs.PRESETS`) read their alpha
(latency) and beta (1 / bandwidth) from it. No other file of the course holds these numbers.

Units, once and for all
-----------------------
* ``bandwidth_Bps`` is in **bytes** per second. Networks are sold in **bits** per second
  (100 GbE is 100 Gb/s), so it is 100e9 / 8 = 12.5e9 B/s: use :func:`gbit_per_s` for them
  and :func:`gbyte_per_s` for figures given in GB/s (1 GB = 1e9 bytes, never 2**30).
* A full-duplex link (Ethernet, InfiniBand, PCIe, NVLink) carries its bandwidth in **each
  direction at once**; vendors often quote the sum of both (NVLink 4 on H100: "900 GB/s" =
  450 GB/s each way). Every link row here is **per direction** (``duplex="per direction"``),
  which is what one message of the alpha-beta model sees. A DRAM channel and HBM are
  half-duplex: reads and writes share the figure (``duplex="shared"``).
* ``latency_s`` is a one-way, small-message time in seconds, where a citable figure exists
  (None otherwise). Latencies depend on the software stack far more than bandwidths do:
  kernel TCP over Ethernet costs tens of microseconds whatever the line rate, while
  InfiniBand verbs and NVLink loads bypass the kernel. Treat them as orders of magnitude.
* ``flops`` (accelerators only): dense half-precision tensor operations per second
  (vendors also quote twice that "with sparsity").

Sources are vendor data sheets and standards, each with its year.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Hardware", "TABLE", "get", "gbit_per_s", "gbyte_per_s", "rows", "table_text", "links"]

Kind = Literal["link", "memory", "accelerator"]
Duplex = Literal["per direction", "shared"]


def gbit_per_s(gigabits: float) -> float:
    """Bytes per second of a rate given in Gb/s (network line rates): 100 -> 12.5e9."""
    return gigabits * 1e9 / 8


def gbyte_per_s(gigabytes: float) -> float:
    """Bytes per second of a rate given in GB/s (1 GB = 1e9 bytes): 450 -> 450e9."""
    return gigabytes * 1e9


def pcie_x16(gigatransfers: float) -> float:
    """Bytes per second of a PCIe 3.0+ x16 link, per direction: 16 lanes x GT/s x 128/130 / 8 bits."""
    return 16 * gigatransfers * 1e9 * 128 / 130 / 8


@dataclass(frozen=True)
class Hardware:
    """One row of the table: a link, a memory or an accelerator, with its source."""
    key: str                     # short name used by the cost-model presets, e.g. "100gbe"
    name: str                    # what it is, as a person would say it
    kind: Kind
    latency_s: float | None      # one-way small-message latency (seconds), order of magnitude
    bandwidth_Bps: float | None  # bytes per second (see ``duplex``)
    duplex: Duplex               # "per direction" (full-duplex link) or "shared" by reads and writes
    source: str                  # where the numbers come from, with the year
    flops: float | None = None   # accelerators: dense FP16/BF16 tensor FLOP/s

    @property
    def beta(self) -> float:
        """Seconds per byte, 1 / bandwidth: the beta of the alpha-beta model."""
        if not self.bandwidth_Bps:
            raise ValueError(f"{self.name} has no bandwidth in the table")
        return 1.0 / self.bandwidth_Bps

    def seconds(self, nbytes: float) -> float:
        """alpha + n beta: one message of ``nbytes`` over this link (Hockney 1994)."""
        if self.latency_s is None:
            raise ValueError(f"{self.name} has no latency in the table")
        return self.latency_s + nbytes * self.beta


_HBM3_H100 = gbyte_per_s(3350)   # the H100 SXM's memory, shared by its two rows below
_TCP = ("one-way latency: kernel TCP/IP over a data-centre network, tens of us (Barroso, Marty, "
        "Patterson & Ranganathan, 'Attack of the killer microseconds', CACM 2017)")

TABLE: tuple[Hardware, ...] = (
    Hardware("1gbe", "1 Gigabit Ethernet (TCP)", "link", 50e-6, gbit_per_s(1), "per direction",
             "IEEE 802.3ab-1999 (1000BASE-T), 1 Gb/s; " + _TCP),
    Hardware("10gbe", "10 Gigabit Ethernet (TCP)", "link", 25e-6, gbit_per_s(10), "per direction",
             "IEEE 802.3ae-2002, 10 Gb/s; " + _TCP),
    Hardware("25gbe", "25 Gigabit Ethernet (TCP)", "link", 25e-6, gbit_per_s(25), "per direction",
             "IEEE 802.3by-2016, 25 Gb/s; " + _TCP),
    Hardware("100gbe", "100 Gigabit Ethernet (TCP)", "link", 25e-6, gbit_per_s(100), "per direction",
             "IEEE 802.3ba-2010, 100 Gb/s; " + _TCP),
    Hardware("ib_ndr", "InfiniBand NDR, one 4x port (RDMA)", "link", 1e-6, gbit_per_s(400), "per direction",
             "NVIDIA ConnectX-7 data sheet (2022): 400 Gb/s per port; about 1 us MPI one-way latency "
             "(OSU micro-benchmarks, osu_latency)"),
    Hardware("pcie4_x16", "PCIe 4.0 x16", "link", 1e-6, pcie_x16(16), "per direction",
             "PCI-SIG PCIe Base Specification 4.0 (2017): 16 GT/s per lane, 128b/130b; latency: "
             "Neugebauer et al., 'Understanding PCIe performance for end host networking', SIGCOMM 2018"),
    Hardware("pcie5_x16", "PCIe 5.0 x16", "link", 1e-6, pcie_x16(32), "per direction",
             "PCI-SIG PCIe Base Specification 5.0 (2019): 32 GT/s per lane, 128b/130b; latency as PCIe 4.0"),
    Hardware("nvlink4", "NVLink 4 (H100 SXM, 18 links)", "link", 0.5e-6, gbyte_per_s(450), "per direction",
             "NVIDIA H100 Tensor Core GPU data sheet (2023): 900 GB/s total = 450 GB/s each way; "
             "latency: 0.4-0.6 us per hop with the low-latency protocol (NCCL 2.x tuning model, "
             "hwLat in src/graph/tuning.cc)"),
    Hardware("ddr5_4800", "DDR5-4800 memory channel", "memory", 100e-9, gbyte_per_s(38.4), "shared",
             "JEDEC JESD79-5 DDR5 SDRAM (2020): 4800 MT/s x 8 bytes; load-to-use latency about 100 ns "
             "(Hennessy & Patterson, Computer Architecture, 6th ed., 2017)"),
    Hardware("hbm3_h100", "HBM3 on H100 SXM (80 GB)", "memory", None, _HBM3_H100, "shared",
             "NVIDIA H100 Tensor Core GPU data sheet (2023): 3.35 TB/s"),
    Hardware("h100_sxm", "NVIDIA H100 SXM (BF16 tensor cores, dense)", "accelerator", None, _HBM3_H100,
             "shared", "NVIDIA H100 Tensor Core GPU data sheet (2023): 989 TFLOP/s dense "
             "(1,979 with sparsity), HBM3 3.35 TB/s", flops=989e12),
)

_BY_KEY = {row.key: row for row in TABLE}


def get(key: str) -> Hardware:
    """The row named ``key`` (e.g. "100gbe", "nvlink4")."""
    if key not in _BY_KEY:
        raise KeyError(f"no hardware {key!r}; known: {sorted(_BY_KEY)}")
    return _BY_KEY[key]


def links() -> list[Hardware]:
    """The link rows, slowest first."""
    return sorted((r for r in TABLE if r.kind == "link"), key=lambda r: r.bandwidth_Bps)


def rows(kinds: tuple[str, ...] = ("link", "memory", "accelerator")) -> list[dict]:
    """The table as plain dicts with readable units (for printing or a DataFrame)."""
    out = []
    for r in TABLE:
        if r.kind not in kinds:
            continue
        out.append({
            "name": r.name, "kind": r.kind,
            "latency (us)": None if r.latency_s is None else r.latency_s * 1e6,
            "bandwidth (GB/s)": None if r.bandwidth_Bps is None else r.bandwidth_Bps / 1e9,
            "direction": r.duplex,
            "TFLOP/s": None if r.flops is None else r.flops / 1e12,
            "source": r.source,
        })
    return out


def table_text(kinds: tuple[str, ...] = ("link", "memory", "accelerator"), sources: bool = True) -> str:
    """The table as aligned text; bandwidth in GB/s (bytes), per direction unless marked 'shared'."""
    def fmt(x, spec, unit):
        return "-" if x is None else format(x, spec) + unit

    lines = [f"{'hardware':<44} {'latency':>9} {'bandwidth':>12}  direction"]
    for row in rows(kinds):
        lines.append(f"{row['name']:<44} {fmt(row['latency (us)'], '.2f', ' us'):>9} "
                     f"{fmt(row['bandwidth (GB/s)'], '.2f', ' GB/s'):>12}  {row['direction']}"
                     + (f", {row['TFLOP/s']:.0f} TFLOP/s" if row["TFLOP/s"] else ""))
    if sources:
        lines.append("sources:")
        lines += [f"  {r['name']}: {r['source']}" for r in rows(kinds)]
    return "\n".join(lines)
