#!/usr/bin/env python3
"""Draws perf/run_perf.sh's measured sweeps, as qccl_sim --plot draws its predictions.

usage: plot_perf.py RESULTS.tsv OUTDIR NETEM_RANKS NETEM_BYTES_PER_S

RESULTS.tsv holds run_perf.sh's rows (phase, impl, nranks, repeat, size, busbw in GB/s, time in us,
wrong). Writes, medians over repeats:
  OUTDIR/perf_shm_nN.png  busbw against size for qccl, Open MPI and Gloo, N ranks over shared memory
  OUTDIR/perf_netem.png   qccl's time against size over the emulated network, uncompressed and per
                          codec (impl qccl:CODEC), beside the uncompressed wire floor
Prints the files it wrote, one per line. Needs matplotlib (Debian: python3-matplotlib).
"""
import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAMES = {"qccl": "qccl", "mpi": "Open MPI", "gloo": "Gloo"}


def medians(rows, column):
    """{(impl, nranks): {size: median of column}}"""
    values = {}
    for r in rows:
        values.setdefault((r["impl"], int(r["nranks"])), {}).setdefault(int(r["size"]), []).append(float(r[column]))
    return {key: {s: statistics.median(v) for s, v in sizes.items()} for key, sizes in values.items()}


def size_axis(ax):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.grid(True, which="both", alpha=0.3)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    path, outdir, netem_ranks, netem_rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    fields = ["phase", "impl", "nranks", "repeat", "size", "busbw", "time", "wrong"]
    rows = list(csv.DictReader(open(path), fieldnames=fields, delimiter="\t"))
    shm = [r for r in rows if r["phase"] == "shm"]
    busbw = medians(shm, "busbw")
    for n in sorted({n for _, n in busbw}):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for impl in ("qccl", "mpi", "gloo"):
            points = sorted(busbw.get((impl, n), {}).items())
            if points:
                ax.plot([s for s, _ in points], [b for _, b in points], marker="o", label=NAMES[impl])
        size_axis(ax)
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"All-reduce, float sum, {n} ranks, shared memory")
        ax.legend()
        fig.tight_layout()
        name = f"{outdir}/perf_shm_n{n}.png"
        fig.savefig(name, dpi=110)
        print(name)
    netem = [r for r in rows if r["phase"] == "netem"]
    if netem:
        times = medians(netem, "time")
        fig, ax = plt.subplots(figsize=(7, 4.5))
        sizes = sorted(times.get(("qccl", netem_ranks), {}))
        for (impl, n), by_size in sorted(times.items()):
            points = sorted(by_size.items())
            label = impl.split(":", 1)[1] if ":" in impl else "uncompressed"
            ax.plot([s for s, _ in points], [t / 1e6 for _, t in points], marker="o", label=label)
        floor = [2 * (netem_ranks - 1) / netem_ranks * s / netem_rate for s in sizes]
        ax.plot(sizes, floor, linestyle="--", color="gray", label="wire floor, uncompressed")
        size_axis(ax)
        ax.set_yscale("log")
        ax.set_ylabel("time (s)")
        ax.set_title(f"All-reduce, {netem_ranks} ranks, emulated {netem_rate * 8 / 1e9:g} Gbit/s links")
        ax.legend()
        fig.tight_layout()
        name = f"{outdir}/perf_netem.png"
        fig.savefig(name, dpi=110)
        print(name)


if __name__ == "__main__":
    main()
