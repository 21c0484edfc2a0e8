"""fnnc.io throughput: a ~100 MB model (50 float32 arrays) through NNC's SQLite format.

Baseline, measured in the same run: ``numpy.save`` / ``numpy.load`` of the same arrays,
one ``.npy`` file each. fnnc's write is one SQLite transaction with ``synchronous=FULL``
(fsync before and after the commit), so the baseline is shown twice: plain ``np.save``
(no fsync, data may still be in the page cache) and ``np.save`` + fsync per file (the
same durability). Target: within 2x of numpy. Medians of several interleaved rounds;
``os.sync()`` before each timed call so one case's dirty pages do not slow the next.

Run: python benchmarks/io_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from fnnc.io import read_parameters, write_parameters


def size(megabytes: float) -> str:
    """``"100 MB"``, ``"1.60 MB"`` or ``"16.0 KB"``: a small test is not ``"0 MB"``."""
    if megabytes >= 10:
        return f"{megabytes:.0f} MB"
    if megabytes >= 1:
        return f"{megabytes:.2f} MB"
    return f"{megabytes * 1e3:.1f} KB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--arrays", type=int, default=50)
    parser.add_argument("--elements", type=int, default=500_000, help="per array")
    args = parser.parse_args()
    rounds = 3 if args.quick else 7
    rng = np.random.default_rng(0)
    arrays = {
        f"t-layer-{i}-0": rng.standard_normal(args.elements).astype(np.float32)
        for i in range(args.arrays)
    }
    megabytes = sum(a.nbytes for a in arrays.values()) / 1e6
    expected = {k: (a.shape, a.dtype) for k, a in arrays.items()}
    work = tempfile.mkdtemp(prefix="fnnc-io-bench-")
    db, npy = os.path.join(work, "model.sqlite"), os.path.join(work, "npy")

    def fnnc_write() -> None:
        if os.path.exists(db):
            os.remove(db)
        write_parameters(db, arrays)

    def fnnc_read() -> None:
        got = read_parameters(db, expected)
        assert len(got) == len(arrays)

    def npy_write(sync: bool) -> Callable[[], None]:
        def run() -> None:
            shutil.rmtree(npy, ignore_errors=True)
            os.makedirs(npy)
            for k, a in arrays.items():
                with open(os.path.join(npy, k + ".npy"), "wb") as f:
                    np.save(f, a)
                    if sync:
                        f.flush()
                        os.fsync(f.fileno())

        return run

    def npy_read() -> None:
        got = {k: np.load(os.path.join(npy, k + ".npy")) for k in arrays}
        assert len(got) == len(arrays)

    cases = {
        "write fnnc (SQLite, fsync)": fnnc_write,
        "write numpy.save": npy_write(False),
        "write numpy.save + fsync": npy_write(True),
        "read  fnnc (read_parameters)": fnnc_read,
        "read  numpy.load": npy_read,
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    try:
        for fn in cases.values():  # warm up: files exist, page cache warm
            fn()
        for _ in range(rounds):
            for name, fn in cases.items():
                os.sync()  # no dirty pages of one case throttle the next one's writes
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
        got = read_parameters(db, expected)
        assert all(np.array_equal(got[k], a) for k, a in arrays.items())
    finally:
        shutil.rmtree(work, ignore_errors=True)

    medians = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{args.arrays} float32 arrays, {size(megabytes)}, median of {rounds} rounds")
    for name, seconds in medians.items():
        print(f"  {name:32s} {seconds * 1e3:8.1f} ms  {megabytes / seconds:8.0f} MB/s")
    w = medians["write fnnc (SQLite, fsync)"]
    r = medians["read  fnnc (read_parameters)"]
    print(f"write ratio fnnc / numpy.save         {w / medians['write numpy.save']:.2f}x")
    print(f"write ratio fnnc / numpy.save + fsync {w / medians['write numpy.save + fsync']:.2f}x")
    print(f"read  ratio fnnc / numpy.load         {r / medians['read  numpy.load']:.2f}x")


if __name__ == "__main__":
    main()
