#!/usr/bin/env python3
"""The Python layer's cost on a blocking all-reduce, against the C API's.

    qcclrun -n 2 -- python3 python/perf/all_reduce_overhead.py [--bytes 1M] [--iters 200] [--repeats 5]

In one process, alternately, the median time of a blocking in-place float32 all-reduce of --bytes
through ``Communicator.all_reduce`` (argument checks, the buffer protocol, the extension, the GIL
released) and through the C API itself (``qcclAllReduce`` called by ctypes from the same library,
whose own call costs ~1 us of its overhead is counted against the C side, making the comparison
conservative for Python).  Prints both medians and their ratio; rank 0 reports.
"""

import argparse
import ctypes
import statistics
import time

import numpy as np

import qccl


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", default="1M", help="message size (default 1M)")
    p.add_argument("--iters", type=int, default=200, help="calls per timing (default 200)")
    p.add_argument("--repeats", type=int, default=5, help="alternating timings of each (default 5)")
    args = p.parse_args()
    with qccl.Communicator.from_env() as comm:
        x = np.ones(parse_size(args.bytes) // 4, np.float32)
        lib = ctypes.CDLL(qccl._qccl.__file__)  # the extension links libqccl: its symbols resolve through it
        c_all_reduce = lib.qcclAllReduce
        c_all_reduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_void_p]
        handle = ctypes.c_void_p(qccl_comm_handle(comm))
        address = x.ctypes.data

        def python_call():
            comm.all_reduce(x)

        def extension_call():
            comm._comm.all_reduce(address, address, x.size, 7, 0, None, None, False, None)

        def c_call():
            if c_all_reduce(address, address, x.size, 7, 0, handle) != 0:
                raise RuntimeError("qcclAllReduce failed")

        times = {"python": [], "c": [], "extension": []}
        for f in (python_call, c_call, extension_call):
            for _ in range(10):
                f()  # warm-up
        for _ in range(args.repeats):
            for name, f in (("c", c_call), ("python", python_call), ("extension", extension_call)):
                comm.barrier()
                start = time.perf_counter()
                for _ in range(args.iters):
                    f()
                times[name].append((time.perf_counter() - start) / args.iters)
        c, py = statistics.median(times["c"]), statistics.median(times["python"])
        ext = statistics.median(times["extension"])
        if comm.rank == 0:
            print(f"{comm.size} ranks, {x.nbytes} bytes float32, {args.iters} calls x {args.repeats}: "
                  f"C API {c * 1e6:.1f} us, extension alone {ext * 1e6:.1f} us, Python {py * 1e6:.1f} us, "
                  f"Python / C = {py / c:.3f}")


def qccl_comm_handle(comm):
    """The qcclComm_t of a Communicator (for this benchmark only)."""
    return comm._comm._handle()


if __name__ == "__main__":
    main()
