"""The hardware table is the one source of real-hardware figures, in consistent units.

course_lib/hardware.py holds latency and bandwidth of real links, memories and accelerators;
lessons 00 and 07 print it and the cost model's presets read it. These tests check its units
against the standards (bits vs bytes, per direction vs both), that the presets are the
table's, and that no notebook or other module carries a copy of its numbers.
"""
from __future__ import annotations

import json
import math
import re

import pytest

from course_lib import costs, hardware

from common import REPO


@pytest.mark.parametrize("key, bytes_per_s", [
    ("1gbe", 125e6), ("10gbe", 1.25e9), ("25gbe", 3.125e9), ("100gbe", 12.5e9),   # Gb/s / 8
    ("ib_ndr", 50e9),                                                             # 400 Gb/s / 8
    ("nvlink4", 450e9),                                                           # 900 GB/s is both ways
    ("ddr5_4800", 38.4e9),                                                        # 4800 MT/s x 8 B
])
def test_bandwidths_are_bytes_per_second_per_direction(key, bytes_per_s):
    assert hardware.get(key).bandwidth_Bps == pytest.approx(bytes_per_s, rel=1e-12)


def test_pcie_counts_the_128b_130b_encoding():
    # 16 lanes x 16 GT/s x 128/130 / 8 = 31.5 GB/s per direction; PCIe 5.0 doubles it
    assert hardware.get("pcie4_x16").bandwidth_Bps == pytest.approx(31.5e9, rel=2e-3)
    assert hardware.get("pcie5_x16").bandwidth_Bps == pytest.approx(2 * hardware.get("pcie4_x16").bandwidth_Bps)


def test_unit_helpers():
    assert hardware.gbit_per_s(100) == 12.5e9
    assert hardware.gbyte_per_s(450) == 450e9


def test_every_row_is_typed_and_cites_a_dated_source():
    assert len({r.key for r in hardware.TABLE}) == len(hardware.TABLE)
    for row in hardware.TABLE:
        assert row.kind in ("link", "memory", "accelerator"), row
        assert re.search(r"\b(19|20)\d\d\b", row.source), f"{row.name}: the source needs a year"
        # links are full duplex and quoted per direction; memories share reads and writes
        assert row.duplex == ("per direction" if row.kind == "link" else "shared"), row
        if row.kind == "link":
            assert row.latency_s is not None and 1e-7 < row.latency_s < 1e-3, row
            assert 1e8 <= row.bandwidth_Bps <= 1e12, row
        if row.kind == "accelerator":
            assert row.flops and row.flops > 1e14, row
    # order of magnitude sanity: kernel TCP is slower to start than RDMA and NVLink
    assert hardware.get("100gbe").latency_s > 10 * hardware.get("ib_ndr").latency_s
    assert [r.key for r in hardware.links()][0] == "1gbe"


def test_seconds_is_alpha_plus_n_beta():
    link = hardware.get("100gbe")
    assert link.seconds(12.5e9) == pytest.approx(link.latency_s + 1.0)
    with pytest.raises(ValueError):
        hardware.get("hbm3_h100").seconds(1)
    with pytest.raises(KeyError, match="known"):
        hardware.get("token ring")


def test_cost_model_presets_come_from_the_table():
    links = hardware.links()
    assert set(costs.PRESETS) == {r.key for r in links}
    for row in links:
        model = costs.PRESETS[row.key]
        assert model.alpha == row.latency_s and model.beta == 1.0 / row.bandwidth_Bps
        assert costs.preset(row.key, gamma=1e-10) == costs.CostModel(row.latency_s, 1.0 / row.bandwidth_Bps, 1e-10)
    with pytest.raises(ValueError, match="not a link"):
        costs.CostModel.from_hardware("h100_sxm")
    # 100 GbE moves 1 GB in 0.08 s: alpha + n beta
    assert costs.preset("100gbe").beta * 1e9 == pytest.approx(0.08)


# ---------------------------------------------------------------- one source
def _table_numbers() -> set[float]:
    """Every number of the table, and the bidirectional and bit-rate forms vendors print
    (the bit rate only when it is not a power of ten: 1e9 and 10e9 are also unit factors)."""
    out = set()
    for r in hardware.TABLE:
        for x in (r.bandwidth_Bps, r.flops):
            if x:
                out |= {x, 2 * x}
                if not math.log10(8 * x).is_integer():
                    out.add(8 * x)
    return {round(x, 3) for x in out}


# A number literal (1_000, 12.5e9, .5, 900E9), not part of a name or of a dotted version: read from
# the whole text, so a figure copied into a string or a comment counts too (and a regex reads the
# package and the notebooks in 0.1 s, where tokenize took 2 s).
NUMBER = re.compile(r"(?<![\w.])(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?(?![\w.])")


def _numbers_in_code(source: str) -> list[tuple[str, float]]:
    found = []
    for match in NUMBER.finditer(source):
        try:
            found.append((match.group(), float(match.group().replace("_", ""))))
        except ValueError:
            pass
    return found


def test_numbers_in_code_reads_every_form_of_a_literal():
    got = [v for _, v in _numbers_in_code("bw = 12.5e9  # 900E9, 1_000_000 and .5; not x2 or v1.2.3")]
    assert got == [12.5e9, 900e9, 1e6, 0.5]


def _code_sources():
    for path in sorted((REPO / "course_lib").rglob("*.py")):
        if path.name != "hardware.py":
            yield path, path.read_text()
    for folder in ("examples", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            yield path, path.read_text()
    for folder in ("notebooks", "solutions", "exercises"):
        for path in sorted((REPO / folder).glob("*.ipynb")):
            cells = json.loads(path.read_text())["cells"]
            for cell in cells:
                if cell["cell_type"] == "code":
                    yield path, "".join(cell["source"])


def test_no_copy_of_the_tables_numbers_elsewhere():
    """A bandwidth or FLOP rate of the table written as a literal anywhere else is a second
    source that will drift (12.5e9 for 100 GbE, 900e9 for NVLink, ...): use hardware.get."""
    numbers = _table_numbers()
    stray = [(path.relative_to(REPO), text) for path, source in _code_sources()
             for text, value in _numbers_in_code(source) if value >= 1e8 and round(value, 3) in numbers]
    assert not stray, f"hardware figures outside course_lib/hardware.py: {stray}"


def test_lessons_00_and_07_state_no_hardware_figure_in_prose():
    """Their text names hardware, but the figures are printed from the table."""
    pattern = re.compile(r"\d[\d.,]*\s*(GB/s|Gb/s|TB/s|MB/s)")
    for name in ("00_cluster_in_your_laptop.ipynb", "07_beyond_one_machine.ipynb"):
        cells = json.loads((REPO / "notebooks" / name).read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        assert not pattern.findall(text), (name, pattern.findall(text))
