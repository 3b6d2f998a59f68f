#!/usr/bin/python3
"""PyTorch DDP (Gloo backend) training troupe's reference MLP or CNN on
Fashion-MNIST: the baseline of `--algorithm allreduce` (bench/allreduce_vs_ddp.sh).

One process per rank. Rank 0 prints one JSON line: samples/s over the steps
after the warm-up (and over all steps, the span troupe's samples_per_s
covers), the mean training loss over the ranks' steps and the test accuracy.

Launch, either way:
  * as troupe's trainer, by scripts/local_cluster.sh (loopback or, with
    TROUPE_NETNS=1, one network namespace per rank): it runs
    `ddp_baseline.py --config CLUSTER.toml --node nodeI [options]` on every
    node; the cluster file gives the rank (the node's place in the list), the
    world size, the rendezvous (node 0's host and port) and the threads (the
    node's `threads`, what troupe's node would use); the interface Gloo binds
    to is the one that holds the node's host address.
      TROUPE_TRAINER=bench/ddp_baseline.py scripts/local_cluster.sh 2 --model cnn --steps 200
  * as torchrun launches a script: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    in the environment (GLOO_SOCKET_IFNAME as Gloo reads it), --threads.

Options: --model mlp|cnn, --steps S (global steps: each rank runs S steps of
its own batch), --warmup W (steps left out of samples_per_s, default 10),
--batch-size B (per rank, default 64), --lr (0.02), --momentum (0.9),
--lr-schedule cosine|constant (troupe's defaults: cosine over one epoch of
global steps), --bucket-cap-mb (DDP's default 25), --compress none|fp16
(DDP's fp16_compress_hook; its bf16 hook needs CUDA and NCCL), --threads, --data-dir, --seed.

It runs with glibc's mmap threshold raised (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_), as a fair PyTorch baseline needs
here (bench/tuned_malloc.py: the script runs itself again with it when it is not).
"""
import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import time

from tuned_malloc import rerun_with_tuned_malloc  # noqa: E402 (bench/, the script's directory)

rerun_with_tuned_malloc()  # same pid: local_cluster.sh's records stay right

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def fail(message, status=2):
    print("ddp_baseline.py: " + message, file=sys.stderr)
    sys.exit(status)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--steps", type=int, default=200, help="global steps (each rank: this many batches)")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of samples_per_s")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--lr-schedule", choices=["cosine", "constant"], default="cosine")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (its default 25)")
    p.add_argument("--compress", choices=["none", "fp16"], default="none",
                   help="fp16: DDP's fp16_compress_hook, gradients sent as float16 (default none; its bf16 hook "
                        "needs CUDA and NCCL)")
    p.add_argument("--tuned", action="store_true",
                   help="gradient_as_bucket_view=True and static_graph=True, DDP's own performance options "
                        "(default: off, DDP's defaults)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (default: the node's, or cores / ranks)")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--config", help="troupe cluster file (scripts/local_cluster.sh passes it)")
    p.add_argument("--node", help="this rank's node name in --config")
    a = p.parse_args(argv)
    if a.steps < 1 or a.batch_size < 1 or not 0 <= a.warmup < a.steps:
        fail("need --steps >= 1, --batch-size >= 1 and 0 <= --warmup < --steps")
    if (a.config is None) != (a.node is None):
        fail("--config and --node go together")
    return a


def interface_of(address):
    """The network interface that holds `address` (Gloo binds to it)."""
    if address.startswith("127."):
        return "lo"
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[3].split("/")[0] == address:
            return f[1].split("@")[0]
    fail("no interface holds %s (is this rank in its network namespace?)" % address, 1)


def rendezvous(a):
    """(rank, world size, threads): from the cluster file, or torchrun's environment."""
    if a.config is None:
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            if k not in os.environ:
                fail("without --config, %s must be set (as torchrun does)" % k)
        world = int(os.environ["WORLD_SIZE"])
        return int(os.environ["RANK"]), world, a.threads or max(1, (os.cpu_count() or 1) // world)
    import tomllib
    try:
        with open(a.config, "rb") as f:
            nodes = tomllib.load(f)["cluster"]["nodes"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as e:
        fail("cannot read the nodes of the cluster file %s: %s" % (a.config, e))
    names = [n["name"] for n in nodes]
    if a.node not in names:
        fail("node '%s' is not in %s (%s)" % (a.node, a.config, ", ".join(names)))
    rank = names.index(a.node)
    os.environ["MASTER_ADDR"] = nodes[0]["host"]
    os.environ["MASTER_PORT"] = str(nodes[0]["port"])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_of(nodes[rank]["host"]))
    return rank, len(nodes), a.threads or int(nodes[rank].get("threads", 1))


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, name):
    for suffix in ("", ".gz"):
        path = os.path.join(data_dir, name + suffix)
        if os.path.exists(path):
            return read_idx(path)
    fail("no %s(.gz) in %s (install dataset-fashion-mnist or pass --data-dir)" % (name, data_dir))


def datasets(data_dir):
    """Train and test images as troupe normalizes them: x / 255, less the training set's mean, over its std."""
    train_x = load(data_dir, "train-images-idx3-ubyte").astype(np.float32) / 255.0
    test_x = load(data_dir, "t10k-images-idx3-ubyte").astype(np.float32) / 255.0
    mean, std = float(train_x.mean(dtype=np.float64)), float(train_x.std(dtype=np.float64))
    def images(x):
        return torch.from_numpy((x - mean) / std).reshape(-1, 1, 28, 28)
    def labels(name):
        return torch.from_numpy(load(data_dir, name).astype(np.int64))
    return (images(train_x), labels("train-labels-idx1-ubyte"), images(test_x), labels("t10k-labels-idx1-ubyte"))


def make_model(name):
    """troupe's zoo::mlp and zoo::cnn (model/zoo.cpp), as bench/torch_baseline.cpp builds them."""
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def batches(n_train, rank, world, batch, seed):
    """This rank's batches: a fresh permutation every epoch, cut among the ranks as DistributedSampler does."""
    epoch = 0
    while True:
        g = torch.Generator().manual_seed(seed + epoch)
        mine = torch.randperm(n_train, generator=g)[rank::world]
        for i in range(0, len(mine) - batch + 1, batch):
            yield mine[i:i + batch]
        epoch += 1


def train(a, rank, world, data):
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(a.seed)
    tuning = {"gradient_as_bucket_view": True, "static_graph": True} if a.tuned else {}
    model = DDP(make_model(a.model), bucket_cap_mb=a.bucket_cap_mb, **tuning)
    if a.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, getattr(default_hooks, a.compress + "_compress_hook"))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    per_epoch = math.ceil(len(train_x) / (a.batch_size * world))
    loss_fn = nn.CrossEntropyLoss()
    loss_sum, marks = 0.0, []
    it = batches(len(train_x), rank, world, a.batch_size, a.seed)
    dist.barrier()
    t0 = time.perf_counter()
    for step in range(a.steps):
        if step == a.warmup:
            marks.append(time.perf_counter())
        if a.lr_schedule == "cosine":
            for group in opt.param_groups:
                group["lr"] = 0.5 * a.lr * (1 + math.cos(math.pi * min(1.0, step / per_epoch)))
        idx = next(it)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(train_x[idx]), train_y[idx])
        loss.backward()
        opt.step()
        loss_sum += loss.item()
    t1 = time.perf_counter()
    total = torch.tensor([loss_sum], dtype=torch.float64)
    dist.all_reduce(total)
    warm_start = marks[0] if marks else t0
    return {"samples_per_s": world * a.batch_size * (a.steps - a.warmup) / (t1 - warm_start),
            "samples_per_s_all": world * a.batch_size * a.steps / (t1 - t0), "train_s": t1 - t0,
            "train_loss": total.item() / (world * a.steps)}, model.module


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum()) for i in range(0, len(x), 1000))
    return correct / len(x)


def main(argv):
    a = parse_args(argv)
    rank, world, threads = rendezvous(a)
    torch.set_num_interop_threads(1)
    torch.set_num_threads(threads)
    data = datasets(a.data_dir)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result, model = train(a, rank, world, data)
    if rank == 0:
        result = {"impl": "ddp-gloo", "torch": torch.__version__, "model": a.model, "ranks": world, "threads": threads,
                  "batch_size": a.batch_size, "steps": a.steps, "warmup": a.warmup, "bucket_cap_mb": a.bucket_cap_mb, "tuned": a.tuned,
                  "compress": a.compress,
                  "lr": a.lr, "momentum": a.momentum, "lr_schedule": a.lr_schedule,
                  **{k: round(v, 4) for k, v in result.items()},
                  "test_accuracy": accuracy(model, data[2], data[3])}
        print(json.dumps(result), flush=True)
    dist.barrier()  # rank 0 keeps the store up until every rank is done
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
