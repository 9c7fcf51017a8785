#!/usr/bin/env python3
"""Data-parallel training over a slow link: DDP with gloo, gloo's fp16 hook, and qccl's hooks.

    qcclrun -n 4 --netem 1gbit -- python3 python/examples/train_ddp.py --plot ddp.png
    qcclrun -n 4 -- python3 python/examples/train_ddp.py --no-speed-verdict   # unshaped
    torchrun --nproc-per-node 4 python/examples/train_ddp.py --no-speed-verdict

(torchrun of Debian 12's torch 1.13 fails in its own option parsing under Python 3.11; the script
reads torchrun's variables, RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, however they are set.)

Trains the same model from the same initial weights once per configuration, one after the other in
the same processes: gloo fp32 (DDP's default), gloo with DDP's fp16_compress_hook, and DDP with
qccl's hook uncompressed, with q8 and error feedback, with Marsit's sign bits and with IntSGD's
int8 sums.  The task (--task digits, the default): scikit-learn's bundled handwritten digits (1,797
8x8 images, 10 classes; a fifth held out), learnt by an MLP wide enough (default 4.3 M parameters,
17 MB of float32 gradients per step) that the all-reduce weighs as much as the arithmetic on a 1
Gbit/s link.  --task embedding: a seeded synthetic recommendation task (see load_embedding_task),
an EmbeddingBag model of 6.55 M parameters whose dense gradient dwarfs its arithmetic.

Prints a table (seconds per epoch, the median over epochs after the first; final training loss;
held-out accuracy; bytes this rank's network interfaces sent per epoch, which under qcclrun --netem
are its emulated link's) and writes a plot of training loss against wall-clock time.  The exit
status is the verdict: 0 when qccl's q8+EF epoch is at least --speedup-fp32 times faster than gloo
fp32's and --speedup-fp16 times faster than gloo fp16's, with accuracy within --accuracy-points of
gloo fp32's; 1 otherwise (--no-speed-verdict checks the accuracy only, for unshaped runs).
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import qccl.torch as qt

CONFIGS = [
    # name, the hook's codec (None: DDP's own all-reduce), whether the codec averages updates
    ("gloo fp32", None, False),
    ("gloo fp16 hook", "fp16", False),
    ("qccl uncompressed", "none", False),
    ("qccl q8+EF", "q8:ef=on", False),
    # Marsit all-reduces the update u = lr * g, not the gradient: a sign round moves every weight by
    # eta_s, a full-precision round (every k-th) by the average u. So the loss is scaled by lr and
    # the optimizer applies what arrives as it is (plain SGD, lr 1).
    ("qccl Marsit", "sign:eta_s=0.0005,k=50", True),
    ("qccl IntSGD int8", "int8", False),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--task", choices=["digits", "embedding"], default="digits",
                   help="digits: scikit-learn's digits with an MLP (default); embedding: a seeded synthetic "
                        "recommendation task whose EmbeddingBag gradient dwarfs its arithmetic")
    p.add_argument("--epochs", type=int, default=3, help="epochs per configuration (default 3)")
    p.add_argument("--hidden", type=int, default=2048,
                   help="digits: width of the MLP's two hidden layers (default 2048); embedding: items / 50 "
                        "(the table has 50 x hidden rows of 64 values: 6.55 M parameters at the default)")
    p.add_argument("--batch", type=int, help="samples per rank per step (default: digits 2, embedding 32)")
    p.add_argument("--lr", type=float, help="SGD learning rate, momentum 0.9 (default: digits 0.02, embedding 0.2)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (default: the CPUs shared out among this host's ranks)")
    p.add_argument("--only", help="comma-separated configuration names to run (default: all)")
    p.add_argument("--plot", help="write the loss-against-time plot to this PNG")
    p.add_argument("--link", default="", help="the link, for the plot's title (e.g. '1 Gbit/s')")
    p.add_argument("--speedup-fp32", type=float, default=3.0, help="required q8+EF speed-up over gloo fp32 (3)")
    p.add_argument("--speedup-fp16", type=float, default=2.0, help="required q8+EF speed-up over gloo fp16 (2)")
    p.add_argument("--accuracy-points", type=float, default=0.5,
                   help="allowed accuracy loss of q8+EF against gloo fp32, in points (0.5)")
    p.add_argument("--no-speed-verdict", action="store_true", help="judge accuracy only (unshaped runs)")
    args = p.parse_args()
    if args.batch is None:
        args.batch = 2 if args.task == "digits" else 32
    if args.lr is None:
        args.lr = 0.02 if args.task == "digits" else 0.2
    return args


def init_distributed():
    """torch.distributed over gloo from torchrun's variables, or from qcclrun's (QCCL_ROOT's host,
    the next port)."""
    if "QCCL_SOCKET_IFNAME" in os.environ:  # qcclrun --netem: gloo on the emulated link, not loopback
        os.environ.setdefault("GLOO_SOCKET_IFNAME", os.environ["QCCL_SOCKET_IFNAME"])
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    else:
        host, port = os.environ["QCCL_ROOT"].rsplit(":", 1)
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{int(port) + 1}",
                                rank=int(os.environ["QCCL_RANK"]), world_size=int(os.environ["QCCL_NRANKS"]))
    return dist.get_rank(), dist.get_world_size()


def ranks_sharing_cpus():
    """The ranks that share this machine's CPUs: all of them when qcclrun's emulated hosts do
    (QCCL_OVERSUBSCRIBED=1), else this host's (torchrun's LOCAL_WORLD_SIZE, qcclrun's
    QCCL_LOCAL_NRANKS)."""
    if os.environ.get("QCCL_OVERSUBSCRIBED") == "1":
        return int(os.environ["QCCL_NRANKS"])
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("QCCL_LOCAL_NRANKS", "1"))))


def load_digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0 - 0.5).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    return (torch.from_numpy(x_train), torch.from_numpy(y_train), torch.from_numpy(x_test), torch.from_numpy(y_test))


def make_model(args):
    torch.manual_seed(0)
    if args.task == "embedding":
        return EmbeddingClassifier(50 * args.hidden, 64)
    hidden = args.hidden
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


class EmbeddingClassifier(torch.nn.Module):
    """The mean of a bag of item embeddings, then a linear layer: DLRM's shape in miniature. Its
    gradient is the whole table (DDP all-reduces it dense) while its arithmetic touches a few rows."""

    def __init__(self, items, dim):
        super().__init__()
        self.table = torch.nn.EmbeddingBag(items, dim, mode="mean")
        self.out = torch.nn.Linear(dim, 2)

    def forward(self, bags):
        return self.out(self.table(bags))


def load_embedding_task(items, samples=12288, bag=20, seed=0):
    """Bags of 20 items drawn from a Zipf law (s = 1.3) over the table, labelled by whether the mean
    of a hidden score per item exceeds its median: popular items recur and can be learnt, rare ones
    cannot, so held-out accuracy is well above chance (~80%) and below 100%."""
    rng = np.random.default_rng(seed)
    score = rng.standard_normal(items)
    bags = rng.permutation(items)[np.minimum(rng.zipf(1.3, size=(samples, bag)) - 1, items - 1)]
    mean = score[bags].mean(1)
    labels = (mean > np.median(mean)).astype(np.int64)
    split = samples * 5 // 6
    return (torch.from_numpy(bags[:split]), torch.from_numpy(labels[:split]), torch.from_numpy(bags[split:]),
            torch.from_numpy(labels[split:]))


def nic_bytes_sent():
    """Bytes this network namespace's interfaces (loopback aside) have sent."""
    total = 0
    for nic in os.listdir("/sys/class/net"):
        if nic != "lo":
            with open(f"/sys/class/net/{nic}/statistics/tx_bytes") as f:
                total += int(f.read())
    return total


def train(name, codec, averages_updates, args, data, rank, size):
    x_train, y_train, x_test, y_test = data
    model = make_model(args)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = None
    if codec == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif codec is not None:
        state = qt.CommHookState(None if codec == "none" else codec)
        ddp.register_comm_hook(state, qt.allreduce_hook)
    if averages_updates:
        opt, loss_scale = torch.optim.SGD(ddp.parameters(), lr=1.0), args.lr
    else:
        opt, loss_scale = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9), 1.0
    mine = torch.arange(rank, len(x_train), size)  # this rank's shard
    steps = len(x_train) // size // args.batch  # the same on every rank, whose shards differ by one
    gen = torch.Generator().manual_seed(1)
    curve, epoch_seconds, epoch_bytes = [], [], []
    dist.barrier()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = mine[torch.randperm(len(mine), generator=gen)]
        epoch_start, bytes_start = time.perf_counter(), nic_bytes_sent()
        losses = []
        for s in range(steps):
            batch = order[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x_train[batch]), y_train[batch])
            (loss * loss_scale).backward()
            opt.step()
            losses.append(loss.item())
        # The epoch ends when the slowest rank's does: time it there.
        elapsed = torch.tensor([time.perf_counter() - epoch_start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        mean_loss = torch.tensor([float(np.mean(losses))])
        dist.all_reduce(mean_loss)
        epoch_seconds.append(float(elapsed))
        epoch_bytes.append(nic_bytes_sent() - bytes_start)
        curve.append((time.perf_counter() - start, float(mean_loss) / size))
        if rank == 0:
            print(f"{name}: epoch {epoch + 1}/{args.epochs}, loss {curve[-1][1]:.4f}, {epoch_seconds[-1]:.2f} s",
                  flush=True)
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(1) == y_test).float().mean()) * 100
    if state is not None:
        state.close()
        state.comm.destroy()
    later = epoch_seconds[1:] or epoch_seconds  # the first epoch also connects and warms up
    return {"name": name, "epoch_s": statistics.median(later), "loss": curve[-1][1], "accuracy": accuracy,
            "bytes": statistics.median(epoch_bytes[1:] or epoch_bytes), "curve": curve}


def plot(results, path, size, link, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        t, loss = zip(*r["curve"])
        ax.plot(t, loss, marker="o", markersize=3, label=f"{r['name']} ({r['epoch_s']:.2f} s/epoch)")
    ax.set_xlabel("wall-clock time (s)")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.set_title(f"DDP, {size} ranks{link}: {title}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    args = parse_args()
    rank, size = init_distributed()
    # Ranks sharing a host share its CPUs: torch's default of a thread per CPU in every rank
    # oversubscribes them, and its spinning threads then slow each other down many times over.
    torch.set_num_threads(args.threads or max(1, len(os.sched_getaffinity(0)) // ranks_sharing_cpus()))
    data = load_digits() if args.task == "digits" else load_embedding_task(50 * args.hidden)
    chosen = [c for c in CONFIGS if args.only is None or c[0] in args.only.split(",")]
    results = [train(name, codec, updates, args, data, rank, size) for name, codec, updates in chosen]
    verdict = 0
    if rank == 0:
        params = sum(p.numel() for p in make_model(args).parameters())
        what = "MLP" if args.task == "digits" else "EmbeddingBag model"
        print(f"{size} ranks, {what} of {params / 1e6:.2f} M parameters ({params * 4 / 1e6:.1f} MB of gradients), "
              f"{args.epochs} epochs of {len(data[0]) // size // args.batch} steps")
        print(f"{'configuration':<20} {'s/epoch':>8} {'x fp32':>7} {'loss':>8} {'accuracy':>9} {'MB sent/epoch':>14}")
        base = {r["name"]: r for r in results}
        for r in results:
            speed = base["gloo fp32"]["epoch_s"] / r["epoch_s"] if "gloo fp32" in base else float("nan")
            print(f"{r['name']:<20} {r['epoch_s']:8.3f} {speed:7.2f} {r['loss']:8.4f} {r['accuracy']:8.2f}% "
                  f"{r['bytes'] / 1e6:14.1f}")
        if {"gloo fp32", "gloo fp16 hook", "qccl q8+EF"} <= base.keys():
            fp32, fp16, q8 = base["gloo fp32"], base["gloo fp16 hook"], base["qccl q8+EF"]
            checks = [(f"q8+EF accuracy {q8['accuracy']:.2f}% within {args.accuracy_points} points of gloo fp32's "
                       f"{fp32['accuracy']:.2f}%", q8["accuracy"] >= fp32["accuracy"] - args.accuracy_points)]
            if not args.no_speed_verdict:
                checks += [(f"q8+EF {fp32['epoch_s'] / q8['epoch_s']:.2f}x faster than gloo fp32 "
                            f"(>= {args.speedup_fp32})", fp32["epoch_s"] / q8["epoch_s"] >= args.speedup_fp32),
                           (f"q8+EF {fp16['epoch_s'] / q8['epoch_s']:.2f}x faster than gloo fp16 "
                            f"(>= {args.speedup_fp16})", fp16["epoch_s"] / q8["epoch_s"] >= args.speedup_fp16)]
            for text, ok in checks:
                print(f"{'PASS' if ok else 'FAIL'}: {text}")
                verdict |= 0 if ok else 1
        if args.plot:
            plot(results, args.plot, size, f" over {args.link}" if args.link else "",
                 "digits MLP" if args.task == "digits" else "synthetic EmbeddingBag task")
            print(f"plot: {args.plot}")
    flag = torch.tensor([verdict])
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    return int(flag)


if __name__ == "__main__":
    sys.exit(main())
