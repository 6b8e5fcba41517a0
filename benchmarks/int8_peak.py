"""Current: a bound the manual uses.
This CPU's int8 dot-product peak: what no 8-bit (or 4-bit, unpacked to 8-bit) prefill can pass.

    PYTHONPATH=. python benchmarks/int8_peak.py [--threads 1,2] [--seconds 2] [--out DIR]

Compiles a loop of sixteen independent AVX-512 VNNI ``vpdpbusd`` accumulators (64 int8 products each, no loads) with
the system C compiler and runs it on 1..N threads: the instruction's throughput, the most multiply-adds a core can
do. A prefill of T tokens through a model of M weights in its products (the output head runs for the last token
only) needs T·M of them, so its rate is bounded by peak / M tokens a second. Prints a table and writes
int8_peak.json under ``--out`` (default benchmarks/results, git-ignored). Needs AVX-512 VNNI (says so otherwise).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from edgespec.identity import cpu_identity

SOURCE = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static long iters;
static volatile int sink;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *run(void *unused) {
    /* sixteen named accumulators, so that they stay in registers and the loop is bound by the instruction's
       throughput, not its latency; each starts from its own value, as accumulators that start alike and take the same
       updates are one value to the compiler, which then keeps one instruction in the loop */
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
    __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2);
    __m512i c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5);
    __m512i c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7), c8 = _mm512_set1_epi32(8);
    __m512i c9 = _mm512_set1_epi32(9), c10 = _mm512_set1_epi32(10), c11 = _mm512_set1_epi32(11);
    __m512i c12 = _mm512_set1_epi32(12), c13 = _mm512_set1_epi32(13), c14 = _mm512_set1_epi32(14);
    __m512i c15 = _mm512_set1_epi32(15);
    for (long i = 0; i < iters; i++) {
        c0 = _mm512_dpbusd_epi32(c0, a, b); c1 = _mm512_dpbusd_epi32(c1, a, b); c2 = _mm512_dpbusd_epi32(c2, a, b);
        c3 = _mm512_dpbusd_epi32(c3, a, b); c4 = _mm512_dpbusd_epi32(c4, a, b); c5 = _mm512_dpbusd_epi32(c5, a, b);
        c6 = _mm512_dpbusd_epi32(c6, a, b); c7 = _mm512_dpbusd_epi32(c7, a, b); c8 = _mm512_dpbusd_epi32(c8, a, b);
        c9 = _mm512_dpbusd_epi32(c9, a, b); c10 = _mm512_dpbusd_epi32(c10, a, b); c11 = _mm512_dpbusd_epi32(c11, a, b);
        c12 = _mm512_dpbusd_epi32(c12, a, b); c13 = _mm512_dpbusd_epi32(c13, a, b);
        c14 = _mm512_dpbusd_epi32(c14, a, b); c15 = _mm512_dpbusd_epi32(c15, a, b);
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                 _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(c12, c13), _mm512_add_epi32(c14, c15)));
    sink = _mm512_reduce_add_epi32(s);
    return unused;
}
int main(int argc, char **argv) {
    int threads = atoi(argv[1]);
    iters = atol(argv[2]);
    pthread_t t[256];
    double start = now();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, run, 0);
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    printf("%.6f\n", now() - start);
    return 0;
}
"""
PRODUCTS_PER_ITER = 16 * 64  # sixteen instructions of 64 int8 multiply-adds


def build(folder: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("no C compiler (cc) found")
    src, exe = folder / "peak.c", folder / "peak"
    src.write_text(SOURCE)
    done = subprocess.run([cc, "-O2", "-mavx512f", "-mavx512vnni", "-pthread", str(src), "-o", str(exe)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cannot compile the AVX-512 VNNI loop here: {done.stderr.strip()[:300]}")
    return exe


def measure(exe: Path, threads: int, seconds: float) -> float:
    """G int8 multiply-adds a second on ``threads`` threads, the loop sized to run about ``seconds``."""
    iters = 10_000_000
    while True:
        out = subprocess.run([str(exe), str(threads), str(iters)], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit("the VNNI loop failed to run: this CPU lacks AVX-512 VNNI")
        elapsed = float(out.stdout)
        if elapsed >= seconds:
            return iters * PRODUCTS_PER_ITER * threads / elapsed / 1e9
        iters = int(iters * max(2.0, 1.2 * seconds / max(elapsed, 1e-3)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=2.0, help="time per measurement (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="int8-peak-") as tmp:
        exe = build(Path(tmp))
        rows = [{"threads": int(t), "g_macs_s": round(measure(exe, int(t), args.seconds), 1)}
                for t in args.threads.split(",")]
    print(f"{'threads':>7}  {'G int8 MACs/s':>13}")
    for r in rows:
        print(f"{r['threads']:>7}  {r['g_macs_s']:>13}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"cpu": cpu_identity(), "machine": platform.machine(), "instruction": "vpdpbusd zmm", "rows": rows}
    (args.out / "int8_peak.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / 'int8_peak.json'}")


if __name__ == "__main__":
    main()
