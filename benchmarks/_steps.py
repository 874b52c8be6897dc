"""The training steps the benchmarks time against each other, one builder per kind.

Each builder returns ``advance(batch)``, which runs one training step on its own state (built
by the builder) and keeps the new state; the model must already be on ``device``:

* :func:`loop_runner`: the ``torch.optim`` loop a user would write, and
  :func:`loop_sb_runner`: that loop with Selective Backprop written by hand around it;
* :func:`hand_runner`: a hand-written pure step (``functional_call`` +
  ``torch.func.grad_and_value`` + Adam in tensor ops), eager or ``torch.compile``\\ d, with
  Selective Backprop's work done by hand (the reference limit);
* :func:`sbfunc_runner`: ``sbfunc.make_train_step`` with :func:`sbfunc_algorithms`, eager or
  compiled one of several ways (:func:`compiled_advance`, for any sbfunc step);
* :func:`score_runner`: sbfunc's no-grad scoring forward of a whole batch (for SB's ideal).

``precision``: ``"fp32"``, or ``"amp_bf16"`` (forward and loss under
``torch.autocast(device.type, dtype=torch.bfloat16)``). The defaults (CPU, fp32) build exactly
the steps ``host_overhead.py`` has always timed. This module is imported by the benchmark
scripts after they set ``OMP_WAIT_POLICY``.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import sbfunc

LR = 1e-3
KEEP = 0.5
CPU = torch.device("cpu")
PRECISIONS = ("fp32", "amp_bf16")
SBFUNC_MODES = ("eager", "compiled", "compile()", "compile()+guards", "compile()/allow",
                "compile(reduce-overhead)")  # fmt: skip
Batch = tuple[torch.Tensor, torch.Tensor]
Advance = Callable[[Batch], object]


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The context the forward and loss run under: none for fp32, bf16 autocast otherwise."""
    if check_precision(precision) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _under(fn: Callable[..., Any], device: torch.device, precision: str) -> Callable[..., Any]:
    """``fn`` itself for fp32 (no extra Python frame in the timed path), else ``fn`` under
    :func:`autocast`."""
    if check_precision(precision) == "fp32":
        return fn

    @functools.wraps(fn)
    def wrapped(*args: Any) -> Any:
        with autocast(device, precision):
            return fn(*args)

    return wrapped


# --- sbfunc-specific construction: the only code that touches sbfunc's step API ------------


def sbfunc_algorithms(
    variant: str, model: nn.Module, classes: int, *, scoring_dtype: torch.dtype | None = None,
    **sb_options: Any,
) -> list[sbfunc.Algorithm]:  # fmt: skip
    """The algorithms of a variant: ``plain``, ``SB`` (rank-power, sbfunc's default),
    ``SB-top-k`` (``policy=top_k``) or ``SB+3`` (SB + CutOut + MixUp + LabelSmoothing); SB
    scores under autocast to ``scoring_dtype`` when one is given; ``sb_options`` go to
    ``SelectiveBackprop`` (``policy=`` replaces the keep, ``ids=``)."""
    if variant == "plain":
        return []
    if variant not in ("SB", "SB-top-k", "SB+3"):
        raise ValueError(f"variant must be 'plain', 'SB', 'SB-top-k' or 'SB+3', got {variant!r}")
    score_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    scoring = sbfunc.score.Scoring(loss_fn=score_fn, dtype=scoring_dtype)
    kept: dict[str, Any] = {"keep": KEEP}
    if variant == "SB-top-k":
        kept = {"policy": sbfunc.policies.top_k(KEEP)}
    kept = {} if "policy" in sb_options else kept
    sb = sbfunc.SelectiveBackprop(0.0, 1.0, interrupt=0, scoring=scoring, **kept, **sb_options)
    if variant != "SB+3":
        return [sb]
    return [sb, sbfunc.algorithms.CutOut(), sbfunc.algorithms.MixUp(num_classes=classes),
            sbfunc.algorithms.LabelSmoothing(num_classes=classes)]  # fmt: skip


def sbfunc_runner(
    model: nn.Module, variant: str, classes: int, mode: str, *,
    device: torch.device = CPU, precision: str = "fp32", backend: str = "inductor",
    key_device: torch.device | None = None, **sb_options: Any,
) -> Advance:  # fmt: skip
    """One sbfunc training step per call; ``mode``: ``"eager"``, ``"compiled"``
    (``torch.compile(step)``), ``"compile()"`` (``step.compile()``: the host plan around the
    compiled core), ``"compile(reduce-overhead)"`` (``step.compile(mode="reduce-overhead")``:
    CUDA graphs), and two attribution modes: ``"compile()+guards"``
    (``step.compile(library_guards=True)``: what the guard filter saves) and
    ``"compile()/allow"`` (``nonfinite="allow"``: what the non-finite guard costs).

    The key lives on the CPU (sbfunc's default) on a CPU and for eager steps; a compiled step
    on an accelerator gets it on the device, so its graph has no CPU tensors (CUDA graphs
    refuse them); ``key_device`` puts it elsewhere. ``precision`` other than fp32 is passed
    to ``make_train_step(precision=)`` (a ``TypeError`` where that argument does not exist),
    and SB scores in bf16 too (its ``Scoring(dtype=)``, as the hand step and
    :func:`score_runner` do). ``backend``: ``torch.compile``'s. ``sb_options``: to
    :func:`sbfunc_algorithms`."""
    if mode not in SBFUNC_MODES:
        raise ValueError(f"mode must be one of {SBFUNC_MODES}, got {mode!r}")
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy, mode="train")
    bf16 = check_precision(precision) != "fp32"
    algorithms = sbfunc_algorithms(
        variant, model, classes, scoring_dtype=torch.bfloat16 if bf16 else None, **sb_options
    )
    extra: dict[str, Any] = {"nonfinite": "allow" if mode == "compile()/allow" else "skip"}
    if bf16:
        extra["precision"] = precision
    step = sbfunc.make_train_step(loss_fn, sbfunc.optim.adam(LR), algorithms, **extra)
    params, buffers = sbfunc.split_module(model, clone=True)
    key_device = key_device or (CPU if mode == "eager" else device)
    state = step.init(params, buffers, key=sbfunc.random.key(0, device=key_device))
    options = {"library_guards": mode == "compile()+guards"} if "compile()" in mode else {}
    mode = "compile()" if mode.startswith("compile()") else mode
    return compiled_advance(step, state, mode, backend, **options)


class GraphStep:
    """``advance(batch)`` of a step compiled with CUDA graphs (``mode="reduce-overhead"``).

    Its state, the graphs' output, lives in their shared memory pool, where a later call of
    this step or of any other CUDA-graph function overwrites it (after
    ``torch.compiler.cudagraph_mark_step_begin``); :meth:`settle` clones it out of the pool.
    Consecutive calls need no settling (each reads its state before the replay writes the
    next one): ``interleaved(after=...)`` settles between blocks, outside the timing."""

    def __init__(self, call: Callable[..., Any], state: Any) -> None:
        self.call, self.state = call, state

    def __call__(self, batch: Any) -> None:
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the last state is an input
        self.state = self.call(self.state, batch)[0]

    def settle(self) -> None:
        self.state = torch.utils._pytree.tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.state
        )


def compiled_advance(
    step: sbfunc.TrainStep, state: Any, mode: str, backend: str, **options: Any
) -> Callable[[Any], object]:
    """``advance(batch)``: one call of ``step`` from ``state`` on, the state kept; ``mode``:
    ``"eager"`` (as it is), ``"compiled"`` (``torch.compile(step)``), ``"compile()"``
    (``step.compile(**options)``) or ``"compile(reduce-overhead)"`` (a :class:`GraphStep`)."""
    if mode == "compile(reduce-overhead)":
        step.compile(backend=backend, mode="reduce-overhead", **options)
        return GraphStep(step, state)
    if mode == "compile()":
        step.compile(backend=backend, **options)
    call = torch.compile(step, backend=backend) if mode == "compiled" else step
    box = [state]

    def advance(batch: Any) -> None:
        box[0] = call(box[0], batch)[0]

    return advance


def score_runner(
    model: nn.Module, mode: str, *,
    device: torch.device = CPU, precision: str = "fp32", backend: str = "inductor",
) -> Advance:  # fmt: skip
    """sbfunc's scoring forward (``sbfunc.score.score_losses``: no grad, eval mode) of the
    whole batch, eager or compiled as the sbfunc step of ``mode`` would be."""
    loss_fn = sbfunc.per_sample_loss(model, F.cross_entropy)
    params, buffers = sbfunc.split_module(model, clone=True)
    dtype = None if check_precision(precision) == "fp32" else torch.bfloat16

    def score(batch: Batch) -> torch.Tensor:
        return sbfunc.score.score_losses(loss_fn, params, buffers, batch, dtype=dtype)

    if mode == "eager":
        return score
    graphs = mode == "compile(reduce-overhead)"
    compiled = torch.compile(
        _own(score), backend=backend, mode="reduce-overhead" if graphs else None
    )
    if not graphs:
        return compiled

    def advance(batch: Batch) -> None:
        torch.compiler.cudagraph_mark_step_begin()
        compiled(batch)

    return advance


# --- the hand-written pure step (the reference limit) ---------------------------------------


class HandState(NamedTuple):
    params: dict[str, torch.Tensor]
    mu: dict[str, torch.Tensor]
    nu: dict[str, torch.Tensor]
    steps: torch.Tensor  # 0-d int64: steps done
    key: torch.Tensor
    buffers: dict[str, torch.Tensor]  # BatchNorm statistics: written to copies, each step


def _hand_forward(
    model: nn.Module, device: torch.device, precision: str
) -> tuple[Callable[..., Any], Callable[..., torch.Tensor]]:
    """``grad_and_value`` of the mean loss and the no-grad per-sample losses, both
    ``f(s, x, y)``. A model with buffers (BatchNorm) runs on copies of them, given to the
    transformed function as an input (the grad transform refuses writes to captured tensors):
    the mean loss returns the written copies as its aux output, the scores drop theirs."""
    call = torch.func.functional_call

    if not dict(model.named_buffers()):  # the original parameters-only step

        def loss(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(call(model, p, (x,)), y)

        def scores(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(call(model, p, (x,)), y, reduction="none")

        gv = torch.func.grad_and_value(_under(loss, device, precision))
        score = _under(scores, device, precision)
        return (lambda s, x, y: (*gv(s.params, x, y), s.buffers)), (
            lambda s, x, y: score(s.params, x, y)
        )

    def loss_b(p: dict, b: dict, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return F.cross_entropy(call(model, (p, b), (x,)), y), b

    def scores_b(p: dict, b: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(call(model, (p, b), (x,)), y, reduction="none")

    gvb = torch.func.grad_and_value(_under(loss_b, device, precision), has_aux=True)
    score_b = _under(scores_b, device, precision)

    def grad_value_buffers(s: HandState, x: torch.Tensor, y: torch.Tensor) -> Any:
        grads, (value, buffers) = gvb(s.params, _copy(s.buffers), x, y)
        return grads, value, buffers

    return grad_value_buffers, lambda s, x, y: score_b(s.params, _copy(s.buffers), x, y)


def _own(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its own code object. Dynamo caches graphs per code object: each compiled
    step gets its own (as TrainStep does), so no step checks another's guards and no model
    runs into the recompile limit."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, None,
                              fn.__closure__)  # fmt: skip


def _copy(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in tensors.items()}


def _rank_power_log_w(batch: int, device: torch.device) -> torch.Tensor:
    """Log rank-power weights of ranks ``0..batch-1`` (0 = the lowest score) at ``KEEP``."""
    return (1.0 / KEEP - 1.0) * torch.log((torch.arange(batch, device=device) + 0.5) / batch)


def hand_rows(
    losses: torch.Tensor, select: str, log_w: torch.Tensor, gumbel: torch.Tensor | None
) -> torch.Tensor:
    """The ``KEEP`` share of the rows, sorted: the top losses (``"top-k"``, no noise), or
    rank-power positions drawn with Gumbel-top-k (``gumbel``) in ascending-loss order and
    mapped back to rows."""
    k = max(1, int(KEEP * losses.shape[0]))
    if select == "top-k" or gumbel is None:
        rows = torch.topk(losses, k, sorted=False).indices
    else:
        positions = torch.topk(log_w + gumbel, k, sorted=False).indices
        rows = torch.argsort(losses)[positions]
    return torch.sort(rows).values


def _hand_step(
    model: nn.Module, select: str | None, batch: int, device: torch.device, precision: str
) -> Callable[[HandState, torch.Tensor, torch.Tensor], tuple[HandState, torch.Tensor]]:
    """The pure step function of :func:`hand_runner`."""
    log_w = _rank_power_log_w(batch, device)
    b1, b2, eps = 0.9, 0.999, 1e-8
    grad_value_buffers, score = _hand_forward(model, device, precision)

    def step(s: HandState, x: torch.Tensor, y: torch.Tensor) -> tuple[HandState, torch.Tensor]:
        if select is not None:
            with torch.no_grad():
                losses = score(s, x, y)
            g = None
            if select == "rank-power":
                g = sbfunc.random.gumbel(sbfunc.random.fold_in(s.key, s.steps), (batch,))
            rows = hand_rows(losses, select, log_w, g)
            x, y = x[rows], y[rows]
        grads, value, buffers = grad_value_buffers(s, x, y)
        count = s.steps + 1
        c1, c2 = 1 - b1**count, 1 - b2**count
        mu = {n: b1 * s.mu[n] + (1 - b1) * g for n, g in grads.items()}
        nu = {n: b2 * s.nu[n] + (1 - b2) * g * g for n, g in grads.items()}
        params = {
            n: p - LR * (mu[n] / c1) / ((nu[n] / c2).sqrt() + eps) for n, p in s.params.items()
        }
        return HandState(params, mu, nu, count, s.key, buffers), value

    return step


def hand_runner(
    model: nn.Module, select: str | None, compiled: bool, batch: int, *,
    device: torch.device = CPU, precision: str = "fp32", backend: str = "inductor",
) -> Advance:  # fmt: skip
    """A pure step written by hand; ``select``: ``None``, ``"rank-power"`` (a no-grad scoring
    forward, a rank-power Gumbel-top-k draw of ``KEEP`` of the rows with noise from an
    :mod:`sbfunc.random` key, as sbfunc draws it) or ``"top-k"`` (the top rows, no noise).
    Its key and step counter live on ``device``; a model's buffers (BatchNorm statistics) are
    part of the state, and its scoring forward runs in the module's mode (sbfunc's in eval
    mode) on a copy of them."""
    if select not in (None, "rank-power", "top-k"):
        raise ValueError(f"select must be None, 'rank-power' or 'top-k', got {select!r}")
    step = _hand_step(model, select, batch, device, precision)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    zeros = {n: torch.zeros_like(p) for n, p in params.items()}
    steps = torch.zeros((), dtype=torch.int64, device=device)
    buffers = _copy(dict(model.named_buffers()))
    state = [HandState(params, zeros, dict(zeros), steps, sbfunc.random.key(0, device=device),
                       buffers)]  # fmt: skip
    call = torch.compile(_own(step), fullgraph=True, backend=backend) if compiled else step

    def advance(b: Batch) -> None:
        state[0] = call(state[0], *b)[0]

    return advance


def loop_runner(
    model: nn.Module, *, device: torch.device = CPU, precision: str = "fp32"
) -> Advance:
    """``opt.zero_grad(); loss.backward(); opt.step()`` with ``torch.optim.Adam`` (the
    forward and loss under :func:`autocast`)."""
    opt = torch.optim.Adam(model.parameters(), LR)
    loss = _under(lambda x, y: F.cross_entropy(model(x), y), device, precision)

    def advance(b: Batch) -> None:
        opt.zero_grad()
        loss(*b).backward()
        opt.step()

    return advance


def loop_sb_runner(
    model: nn.Module, select: str, batch: int, *,
    device: torch.device = CPU, precision: str = "fp32",
) -> Advance:  # fmt: skip
    """Selective Backprop written by hand around :func:`loop_runner`: a no-grad scoring
    forward in eval mode (as sbfunc scores), the rows :func:`hand_rows` keeps (its Gumbel
    noise from torch's generator, as a user would draw it), the loop's step on them."""
    if select not in ("rank-power", "top-k"):
        raise ValueError(f"select must be 'rank-power' or 'top-k', got {select!r}")
    step = loop_runner(model, device=device, precision=precision)
    scores = _under(lambda x, y: F.cross_entropy(model(x), y, reduction="none"), device, precision)
    log_w = _rank_power_log_w(batch, device)

    def advance(b: Batch) -> None:
        x, y = b
        model.eval()
        with torch.no_grad():
            losses = scores(x, y)
        model.train()
        gumbel = None
        if select == "rank-power":  # -log of Exp(1) draws
            gumbel = torch.empty_like(log_w).exponential_().log_().neg_()
        rows = hand_rows(losses, select, log_w, gumbel)
        step((x[rows], y[rows]))

    return advance
