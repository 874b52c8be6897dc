"""Data-parallel Selective Backprop on two CPU processes: local vs global selection.

Each rank trains on its shard of every global batch of scikit-learn's bundled digits (no
download) with ``sbfunc.distributed.make_data_parallel_step``; gradients are the mean over all
ranks' kept rows. Selective Backprop keeps rows with Jiang et al.'s CDF policy (a data-dependent
count), selecting either per rank (``local``, Composer's way) or over the global batch
(``global``, InfoBatch's way), optionally rebalancing the kept rows so every rank backpropagates
the same count. For every mode it prints the test accuracy, the rows each rank backpropagated
per step, how uneven they were (the slowest rank sets the pace of a synchronous step) and the
bytes per step and rank of every collective, measured by a ``TrafficMeter`` next to the
prediction from shapes and dtypes. The last run is checkpointed once (rank 0) and reloaded.

Run: ``torchrun --standalone --nproc_per_node 2 examples/distributed.py`` (``--fast`` for a
smoke run). Started with plain ``python``, it spawns the two processes itself.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import sbfunc
from sbfunc import distributed as sbdist

MODES = {  # name: (scope kind, or None for plain steps; rebalance; policy)
    "no selection": (None, False, None),
    "local, rank-power (Composer)": ("local", False, "rank_power"),
    "local": ("local", False, "jiang"),
    "global": ("global", False, "jiang"),
    "local+rebalance": ("local", True, "jiang"),
    "global+rebalance": ("global", True, "jiang"),
}
FAST = ["no selection", "local", "global+rebalance"]


def train(mode, data, args, comm, meter):
    """One run; returns the state, the step and, per step, this rank's backpropagated rows."""
    kind, rebalance, rule = MODES[mode]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    model = model.to(data.x_train.device)
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    algorithms = []
    if kind is not None:
        scope = sbdist.local_selection if kind == "local" else sbdist.global_selection
        algorithms.append(
            sbfunc.SelectiveBackprop(
                start=0.0,
                end=1.0,
                interrupt=0,
                policy=scope(
                    sbfunc.policies.jiang_cdf(beta=1.0, history=256)
                    if rule == "jiang"
                    else sbfunc.policies.rank_power(0.5),
                    rebalance=rebalance,
                    comm=comm,
                ),
            )
        )
    step = sbdist.make_data_parallel_step(loss_fn, sbfunc.optim.adam(3e-3), algorithms, comm=comm)
    key = sbfunc.random.key(0)
    state = step.init(*sbfunc.split_module(model, clone=True), key=key)
    meter.reset()  # count the steps only, not the initial broadcast
    rows = []
    for epoch in range(args.epochs):
        batches = sbdist.sharded_batches(
            [data.x_train, data.y_train], args.batch, key=key, epoch=epoch, comm=comm
        )
        for x, y, _ in batches:
            state, metrics = step(state, (x, y))
            rows.append(metrics.samples_backpropagated)
        t = state.time
        state = state.replace(time=t._replace(epoch=t.epoch + 1, batch_in_epoch=0))
    return state, step, rows


def accuracy(state, data) -> float:
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    model = model.to(data.x_test.device)
    model.load_state_dict(state.params)
    with torch.no_grad():
        return (model(data.x_test).argmax(1) == data.y_test).float().mean().item()


def predicted(state, comm, data, args):
    """Bytes of a run on this rank from shapes and dtypes: the gradient all-reduce every step;
    for a selection that communicates, the row counts (int64) and scores (float32, padded to
    the longest shard of the step) all-gathers."""
    w, n = comm.world, data.x_train.shape[0]
    gradients = sbdist.gradient_traffic(state.params.values(), world=w)
    steps, sizes, scores = [], [], []
    for epoch in range(args.epochs):
        key = sbfunc.random.key(0)
        shards = [
            sbdist.shard_ids(n, args.batch, key=key, epoch=epoch, rank=r, world=w)
            for r in range(w)
        ]
        for parts in zip(*shards, strict=True):
            steps.append(gradients)
            sizes.append(sbdist.gather_traffic(1, 8, world=w))
            scores.append(sbdist.gather_traffic(max(len(p) for p in parts), 4, world=w))
    return {"gradients": steps, "sizes": sizes, "scores": scores}


def _total(traffic):
    return sbdist.Traffic(*(sum(t[i] for t in traffic) for i in range(3)))


def report(mode, state, rows, meter, comm, data, args) -> None:
    """Rank 0 prints accuracy, the rows per rank and step, and the bytes per step."""
    everyone = [None] * comm.world
    dist.all_gather_object(everyone, rows, group=comm.group)  # host lists, off the hot path
    if comm.rank != 0:
        return
    steps = len(rows)
    per_rank = [sum(r) / steps for r in everyone]
    slowest = sum(max(r[i] for r in everyone) for i in range(steps)) / steps
    print(
        f"\n{mode}: test accuracy {accuracy(state, data):.3f}; rows per step by rank "
        f"{', '.join(f'{r:.1f}' for r in per_rank)}; slowest rank / mean "
        f"{slowest / (sum(per_rank) / len(per_rank)):.3f}"
    )
    want = predicted(state, comm, data, args)
    for purpose, t in sorted(meter.totals().items()):
        line = (
            f"  {purpose:<9} {t.calls / steps:3.1f} calls, payload {t.payload / steps:8.0f} B, "
            f"received {t.received / steps:8.0f} B per step"
        )
        if purpose in want:
            same = _total(want[purpose]) == t
            line += f"  (as predicted from shapes: {'yes' if same else 'NO'})"
        print(line)


def run(args) -> None:
    meter = sbdist.TrafficMeter()
    comm = sbdist.Comm(meter=meter)
    data = sbfunc.datasets.digits(key=sbfunc.random.key(0))
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        data = sbfunc.datasets.Split(*(t.to(device) for t in data))
    if comm.rank == 0:
        print(
            f"world {comm.world} ({dist.get_backend()}), {args.batch} rows per rank and step "
            f"(global batch {args.batch * comm.world}), {args.epochs} epoch(s); rank 0's "
            "traffic (payload: bytes it hands to a collective; received: bytes it gets)"
        )
    for mode in FAST if args.fast else MODES:
        state, _, rows = train(mode, data, args, comm, meter)
        report(mode, state, rows, meter, comm, data, args)
    path = Path(args.checkpoint)  # the working folder: every rank of one machine reads it
    sbdist.save_data_parallel(state, path, comm=comm)
    loaded = sbdist.load_data_parallel(path, like=state, comm=comm)
    same = all(torch.equal(loaded.params[k], state.params[k]) for k in state.params)
    if comm.rank == 0:
        print(f"\ncheckpoint {path} written once by rank 0, reloaded on every rank: {same}")


def _spawned(rank: int, world: int, store: str, args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        run(args)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one epoch, three modes")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="rows per rank and step")
    parser.add_argument("--checkpoint", default="distributed_checkpoint.pt")
    args = parser.parse_args()
    if args.fast:
        args.epochs = 1
    if "RANK" in os.environ:  # started by torchrun
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo")
        try:
            run(args)
        finally:
            dist.destroy_process_group()
    else:  # plain python: spawn two gloo processes on this machine
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(
                _spawned, args=(2, f"{tmp}/store", args), nprocs=2, start_method="spawn"
            )


if __name__ == "__main__":
    main()
