"""The benchmarks' printed figures say what they measured: a ratio below 1 is not
"slower", an unmeasured figure is "-" (not "nanMB"), a small size is not "0 MB"."""

import numpy as np

from benchmarks import data_pipeline, io_throughput, memory


def test_a_rate_ratio_below_one_reads_faster_with_the_inverted_ratio():
    assert data_pipeline.versus(3.9).strip() == "3.90x slower than"
    assert data_pipeline.versus(1.0).strip() == "1.00x slower than"
    # 83e6 samples/s against a 6.5e6 baseline: the time ratio 6.5/83, 12.77x faster
    assert data_pipeline.versus(6.5e6 / 83e6).strip() == f"{83 / 6.5:.2f}x faster than"


def test_memory_rows_not_compiled_show_a_dash_in_the_same_column(capsys):
    rows = [
        {"name": "plain", "peak": 27.81, "kept": 24.54, "xla_temp": 33.07, "recomputed": 0.0},
        {"name": "remat", "peak": 12.81, "kept": 9.54, "xla_temp": np.nan, "recomputed": 1.0},
    ]
    memory.show(rows)
    _, plain, remat = capsys.readouterr().out.splitlines()
    assert "nan" not in remat
    at = plain.index("33.07MB")
    assert remat[at : at + len("33.07MB")] == "      -"  # right-aligned under the figure
    assert remat[at + 7 :].split()[0] == "1.000GF"  # the next column stays in place


def test_io_sizes_keep_their_digits_when_small():
    assert io_throughput.size(4 * 1000 * 4 / 1e6) == "16.0 KB"  # 4 arrays of 1000 floats
    assert io_throughput.size(1.6) == "1.60 MB"
    assert io_throughput.size(100.0) == "100 MB"
