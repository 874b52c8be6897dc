"""The work of the spawned gloo ranks, and the launcher that bounds it in time.

:func:`launch` starts ``WORLD`` processes (``torch.multiprocessing``, spawn), each joining a
gloo group through a file store and running the named checks of :data:`CHECKS`; each saves its
results to ``OUT/rank{r}.pt`` for the test process to compare. One launch shares the start-up
(importing torch) across all its checks.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

import sbfunc
from sbfunc import distributed as sbdist
from tests.distributed import common


def scenario_runs(comm: sbdist.Comm) -> dict[str, Any]:
    """Every scenario of ``common.SCENARIOS`` trained on this rank."""
    out = {}
    for name, scenario in common.SCENARIOS.items():
        step, state = common.build(scenario, comm)
        out[name] = common.run(step, state, rank=comm.rank, world=comm.world)
    return out


def traffic(comm: sbdist.Comm) -> dict[str, Any]:
    """The bytes of one step of a global selection that keeps only rank 0's rows and
    rebalances them, measured by a meter."""
    meter = sbdist.TrafficMeter()
    metered = sbdist.Comm(comm.group, meter=meter)
    step, state = common.build(common.SCENARIOS["global_empty_rank_rebalance"], metered)
    meter.reset()  # the init broadcast is not part of a step
    x, y = common.data()
    batch = next(iter(sbdist.sharded_batches([x, y], common.BATCH, key=common.KEY, epoch=0)))
    step(state, batch)
    return {"totals": meter.totals(), "params": state.params}


def _resume_build(comm: sbdist.Comm):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv1d(1, 4, 3, padding=1), nn.BatchNorm1d(4), nn.ReLU(), nn.Flatten(), nn.Linear(24, 3)
    )
    loss_fn = sbfunc.per_sample_loss(net, F.cross_entropy, mode="train")
    x, y = common.data()
    x = x.unsqueeze(1)
    example = (x[: common.BATCH], y[: common.BATCH], torch.arange(common.BATCH))
    algorithms = [
        sbfunc.SelectiveBackprop(
            0.0,
            1.0,
            interrupt=3,
            policy=sbdist.local_selection(sbfunc.policies.jiang_cdf(1.0, history=32), comm=comm),
            refill=example,
        ),
        sbdist.per_rank(sbfunc.algorithms.CutOut(length=0.25), comm=comm),
    ]
    step = sbdist.make_data_parallel_step(loss_fn, sbfunc.optim.adam(1e-2), algorithms, comm=comm)
    state = step.init(*sbfunc.split_module(net, clone=True), key=common.KEY)

    def data(epoch: int):
        return sbdist.sharded_batches([x, y], common.BATCH, key=common.KEY, epoch=epoch, comm=comm)

    return step, state, data


def resume(comm: sbdist.Comm, out: Path) -> dict[str, Any]:
    """Uninterrupted versus stopped, saved, loaded into a fresh state and finished."""
    epochs, per_epoch = 3, common.N // (common.BATCH * comm.world)
    step, fresh, data = _resume_build(comm)
    full = sbfunc.fit(step, fresh, data, epochs=epochs, progress=False).state
    half = sbfunc.fit(step, fresh, data, epochs=epochs, progress=False, stop_after=4).state
    sbdist.save_data_parallel(half, out / "half.pt", comm=comm)
    step, template, data = _resume_build(comm)
    loaded = sbdist.load_data_parallel(out / "half.pt", like=template, comm=comm)
    resumed = sbfunc.fit(step, loaded, data, epochs=epochs, progress=False).state
    shared = sbdist.split_state(full)[0]
    return {
        "full": full,
        "half": half,
        "loaded": loaded,
        "resumed": resumed,
        "steps": epochs * per_epoch,
        "mismatches": sbdist.replica_mismatches(shared, comm=comm),
    }


def compiled(comm: sbdist.Comm) -> dict[str, Any]:
    """A compiled and an eager data-parallel step (no selection: one graph), side by side."""
    torch._dynamo.reset()
    scenario = common.SCENARIOS["global_rank_power"]
    step, state = common.build(scenario, comm, algorithms=False)
    eager = common.run(step, state, rank=comm.rank, world=comm.world, epochs=1)
    step, state = common.build(scenario, comm, algorithms=False)
    counters.clear()
    compiled = torch.compile(step, backend="aot_eager")  # the traced collectives, no codegen
    fast = common.run(compiled, state, rank=comm.rank, world=comm.world, epochs=1)
    return {"eager": eager, "compiled": fast, "graph_breaks": dict(counters["graph_break"])}


def nonfinite(comm: sbdist.Comm) -> dict[str, Any]:
    """A NaN loss on rank 1 only: with ``nonfinite="skip"`` both ranks skip the update, with
    ``"raise"`` both raise."""
    net = common.model()
    base = sbfunc.per_sample_loss(net, F.cross_entropy, mode="train")

    def loss_fn(params, buffers, batch):
        losses = base(params, buffers, batch)
        return losses * float("nan") if comm.rank == 1 else losses

    x, y = common.data()
    batch = (x[comm.rank * 8 : comm.rank * 8 + 8], y[comm.rank * 8 : comm.rank * 8 + 8])
    out: dict[str, Any] = {}
    for mode in ("skip", "raise"):
        step = sbdist.make_data_parallel_step(
            loss_fn, sbfunc.optim.sgd(0.1), comm=comm, nonfinite=mode
        )
        state = step.init(*sbfunc.split_module(net, clone=True), key=common.KEY)
        try:
            new, metrics = step(state, batch)
            out[mode] = (
                bool(metrics.skipped),
                torch.equal(new.params["0.weight"], state.params["0.weight"]),
            )
        except FloatingPointError as err:
            out[mode] = str(err)
    return out


def tokens(comm: sbdist.Comm) -> dict[str, Any]:
    """Token selection in a data-parallel step: each rank keeps half of its own batch's tokens
    (local selection); one SGD step, the parameters after it and the kept-token count."""
    loss_fn, params, buffers = common.token_model()
    step = sbdist.make_data_parallel_step(
        loss_fn, sbfunc.optim.sgd(0.5), [common.token_selection()], comm=comm
    )
    state = step.init(params, buffers, key=common.KEY)
    state, metrics = step(state, common.token_batch(comm.rank))
    return {"params": state.params, "loss": metrics.loss}


def frozen(comm: sbdist.Comm) -> dict[str, Any]:
    """A causal LM whose blocks and embeddings are frozen, trained with token selection and
    ``buffers="mean"`` (issue 40, item 1): the frozen tensors after two steps, and the bytes
    each purpose moved (a frozen parameter is never synchronised as a buffer)."""
    loss_fn, _, _ = common.token_model()
    for name, p in loss_fn.module.named_parameters():
        p.requires_grad_(name.startswith("ln_f."))
    meter = sbdist.TrafficMeter()
    step = sbdist.make_data_parallel_step(
        loss_fn, sbfunc.optim.adamw(1e-2, weight_decay=0.1), [common.token_selection()],
        comm=sbdist.Comm(comm.group, meter=meter), buffers="mean",
    )  # fmt: skip
    state = step.init(*sbfunc.split_module(loss_fn.module, clone=True), key=common.KEY)
    meter.reset()  # the init broadcast is not part of a step
    after = state
    for _ in range(2):
        after, _ = step(after, common.token_batch(comm.rank))
    return {"before": state.buffers, "after": after.buffers, "traffic": meter.totals()}


CHECKS = {
    "nonfinite": lambda comm, out: nonfinite(comm),
    "scenarios": lambda comm, out: scenario_runs(comm),
    "traffic": lambda comm, out: traffic(comm),
    "resume": resume,
    "compiled": lambda comm, out: compiled(comm),
    "tokens": lambda comm, out: tokens(comm),
    "frozen": lambda comm, out: frozen(comm),
}


def worker(rank: int, world: int, out: str, checks: list[str]) -> None:
    torch.set_num_threads(1)
    path = Path(out)
    dist.init_process_group(
        "gloo", init_method=f"file://{path / 'store'}", rank=rank, world_size=world
    )
    try:
        comm = sbdist.Comm()
        results = {}
        for name in checks:
            results[name] = CHECKS[name](comm, path)
        torch.save(results, path / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def launch(checks: list[str], out: Path, *, timeout_s: float) -> list[dict[str, Any]]:
    """Run ``checks`` on ``common.WORLD`` gloo ranks; every rank's results, in rank order.

    Raises:
        TimeoutError: if the ranks have not finished within ``timeout_s`` (they are killed).
        torch.multiprocessing.ProcessRaisedException: if a rank raised.
    """
    ctx = mp.start_processes(
        worker,
        args=(common.WORLD, str(out), checks),
        nprocs=common.WORLD,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(
                f"the {common.WORLD} ranks did not finish {checks} in {timeout_s} s"
            )
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(common.WORLD)]
