"""``make_train_step``: check the pieces of a training step and build its :class:`TrainStep`."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from sbfunc._namespace import REMOVED_IN
from sbfunc.batch import check_per_sample
from sbfunc.engine import DEFAULT_PASSES, Algorithm, Pass
from sbfunc.module import ModuleLoss, check_loss_fn, draws_randomness
from sbfunc.optim import GradientTransformation, scales_loss
from sbfunc.step._microbatch import Microbatching, check_microbatching
from sbfunc.step._objective import AUTOCAST, ObjectiveKind, Precision
from sbfunc.step._records import NonFinite
from sbfunc.step._replicas import ONE_PROCESS, Replicas
from sbfunc.step._train_step import TrainStep
from sbfunc.types import LossFn, PerSample
from sbfunc.validation import check_bool, check_choice

__all__ = ["make_train_step"]


def make_train_step(
    loss_fn: LossFn,
    optimizer: GradientTransformation,
    algorithms: Sequence[Algorithm] = (),
    passes: Sequence[Pass] = DEFAULT_PASSES,
    *,
    nonfinite: NonFinite = "skip",
    keyed_model: bool | None = None,
    microbatching: Microbatching | None = None,
    per_sample: PerSample = None,
    replicas: Replicas = ONE_PROCESS,
    precision: Precision = "fp32",
    objective: ObjectiveKind = "tokens",
    **legacy: Any,
) -> TrainStep:
    """Build a pure training step ``step(state, batch) -> (state, metrics)``.

    ``state = step.init(params, buffers, key=key)`` builds the whole initial
    :class:`~sbfunc.TrainState` (optimizer and algorithm states included). One call fires the
    per-batch events :data:`BATCH_EVENTS` in Composer's order and, between them:

    * after ``BEFORE_FORWARD``: the forward (``state.outputs`` is set for ``AFTER_FORWARD``
      when ``loss_fn`` is a :class:`sbfunc.module.ModuleLoss`), then ``AFTER_FORWARD`` and
      ``BEFORE_LOSS``, then the per-sample losses of ``state.batch`` (so targets changed on
      ``BEFORE_LOSS`` count) and their weighted mean with ``state.sample_weights``
      (:func:`weighted_mean`);
    * ``AFTER_LOSS`` and ``BEFORE_BACKWARD`` see ``loss`` and the per-sample ``losses``, and
      what they leave is differentiated (a new ``loss``, or new ``losses`` or
      ``sample_weights`` averaged again); ``AFTER_BACKWARD`` sees ``grads`` (and may change
      them). A change nothing later reads raises (:mod:`sbfunc.engine`);
    * then the optimizer update ``optimizer.update(grads, opt_state, params)``.

    A batch left with **zero rows** after ``BEFORE_FORWARD`` (Selective Backprop with
    ``refill`` queues its kept rows until a full batch is ready) makes no update: only
    ``BATCH_END`` fires and the step counts as skipped. With ``nonfinite="skip"`` (the
    default) an update whose loss or gradient is not finite never reaches the parameters,
    buffers or optimizer state: it is counted in ``metrics.skipped`` and
    ``state.time.updates_skipped``, without a host sync; ``"raise"`` raises
    ``FloatingPointError`` instead (reading the flag syncs); ``"allow"`` applies it.

    **Microbatching** (gradient accumulation): with
    ``microbatching=sbfunc.step.Microbatching(chunks=k)`` (or ``size=m``) the rows kept after
    ``BEFORE_FORWARD`` (after Selective Backprop's selection) are split into chunks;
    ``AFTER_FORWARD`` ... ``BEFORE_BACKWARD`` fire per chunk and the gradients add up to the
    whole batch's exactly (see :class:`~sbfunc.step.Microbatching`, also for BatchNorm); a
    token selection still ranks the whole batch's tokens.

    **Mixed precision** (Composer's ``precision=``): ``"amp_bf16"`` or ``"amp_fp16"`` run the
    forward and the loss under ``torch.autocast`` on the parameters' device with that dtype;
    the parameters, gradients and optimizer state keep the dtypes they have (float32 master
    weights for a float32 model). ``"amp_fp16"`` needs an optimizer wrapped in
    :func:`sbfunc.optim.dynamic_loss_scale`: the step then differentiates ``loss * scale``
    and divides the gradients by the scale before ``AFTER_BACKWARD`` (algorithms and clipping
    see the true gradients; the reported loss is not scaled); an overflow skips the update as
    ``nonfinite="skip"`` does (counted), and the scale backs off. Selective Backprop's
    scoring forward keeps its own ``Scoring(dtype=...)`` (see ``docs/how-to/mixed-precision.md``).

    Randomness inside the model (dropout) draws from the state's key, not from torch's global
    generator (:func:`sbfunc.random.keyed`), so a run resumes bit for bit.

    ``step.compile()`` compiles it in place (:meth:`TrainStep.compile`; ``torch.compile(step)``
    works too); it still has ``init`` and ``run_event`` and works with :func:`sbfunc.fit`.

    Args:
        loss_fn: the per-sample training loss (``sbfunc.per_sample_loss(..., mode="train")``).
        optimizer: an :mod:`sbfunc.optim` optimizer, e.g. ``sbfunc.optim.adam(1e-3)``.
        algorithms: the algorithms to run (see :func:`sbfunc.sequence`).
        passes: the ordering passes (default :data:`sbfunc.engine.DEFAULT_PASSES`).
        nonfinite: ``"skip"``, ``"raise"`` or ``"allow"`` (see above).
        keyed_model: draw the model's random operations from the state's key; ``None``
            (default) does so when ``loss_fn`` is a ``per_sample_loss`` of a module with
            dropout (or multi-head attention) layers.
        microbatching: how to split the kept rows (:class:`~sbfunc.step.Microbatching`:
            ``chunks=k`` near-equal chunks, or chunks of ``size=m`` rows); ``None``: no split.
        per_sample: which leaves of the batch are per-sample (:data:`sbfunc.types.PerSample`),
            to count its rows; ``None`` infers them. It must be the spec of every algorithm
            that prunes rows (``SelectiveBackprop(per_sample=...)``).
        replicas: how the step combines with other processes (:mod:`sbfunc.step`):
            :data:`~sbfunc.step.ONE_PROCESS` (default) or
            :class:`sbfunc.distributed.DataParallel`.
        precision: ``"fp32"`` (default: no autocast), ``"amp_bf16"`` or ``"amp_fp16"``.
        objective: for a loss over tokens (:class:`sbfunc.module.TokenLosses`: a token
            criterion, or cross-entropy of ``[N, T...]`` integer labels), what the step
            averages: ``"tokens"`` (default: every real token of the batch, Hugging Face's
            loss) or ``"rows"`` (the mean of the rows' means). Any other loss averages rows.

    Raises:
        TypeError: for a wrong type of argument or a malformed ``per_sample`` spec.
        ValueError: for ``nonfinite``, ``precision`` or ``objective`` out of their values,
            ``"amp_fp16"`` without :func:`sbfunc.optim.dynamic_loss_scale`, a loss scale with
            ``nonfinite="allow"``, or an algorithm pruning with another ``per_sample`` spec
            than ``per_sample``.
        DeprecationWarning: for 1.1's ``microbatches=`` / ``microbatch_size=`` (now
            ``microbatching=``; removed in 1.3).

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(
        ...     model, torch.nn.functional.cross_entropy, mode="train")
        >>> step = sbfunc.make_train_step(loss_fn, sbfunc.optim.sgd(0.1))
        >>> params, buffers = sbfunc.split_module(model, clone=True)
        >>> state = step.init(params, buffers, key=sbfunc.random.key(0))
        >>> state, metrics = step(state, (torch.randn(8, 4), torch.randint(0, 3, (8,))))
        >>> state.time.step, metrics.samples_backpropagated
        (1, 8)

    References:
        MosaicML Composer's training loop events; optax's ``init``/``update``; optax
        ``apply_if_finite``; ``jax.jit(train_step)``.
    """
    loss_fn = _training_loss(check_loss_fn(loss_fn))
    _check_optimizer(optimizer)
    check_choice(nonfinite, "nonfinite", ("skip", "raise", "allow"))
    _check_precision(precision, optimizer, nonfinite)
    check_choice(objective, "objective", ("tokens", "rows"))
    split = _microbatching(microbatching, legacy)
    if keyed_model is None:
        keyed_model = isinstance(loss_fn, ModuleLoss) and draws_randomness(loss_fn.module)
    check_bool(keyed_model, "keyed_model", fix="or None")
    check_per_sample(per_sample)
    if not isinstance(replicas, Replicas):
        raise TypeError(
            "replicas must be sbfunc.step.ONE_PROCESS or an "
            f"sbfunc.distributed.DataParallel, got {type(replicas).__name__}"
        )
    algorithms = _for_step(algorithms, loss_fn, per_sample)
    return TrainStep(
        loss_fn, optimizer, algorithms, tuple(passes), nonfinite, keyed_model, split,
        per_sample=per_sample, replicas=replicas, precision=precision, objective=objective,
    )  # fmt: skip


def _training_loss(loss_fn: LossFn) -> LossFn:
    """A :class:`~sbfunc.module.ModuleLoss` in train mode (``"auto"`` becomes ``"train"``);
    an eval-mode one is refused (it would train without dropout, BatchNorm frozen)."""
    if not isinstance(loss_fn, ModuleLoss):
        return loss_fn
    if loss_fn.mode == "eval":
        raise ValueError(
            "loss_fn evaluates the model in eval mode (per_sample_loss(..., mode='eval')), "
            "so the step would train without dropout and with BatchNorm frozen on its "
            "running statistics; leave mode at its default ('auto': the step trains in "
            "train mode) or pass mode='train'"
        )
    return loss_fn.with_mode("train") if loss_fn.mode == "auto" else loss_fn


def _check_optimizer(optimizer: object) -> None:
    """Raise unless ``optimizer`` is a gradient transformation (``init`` and ``update``)."""
    if type(optimizer).__module__.split(".")[0] == "torchopt":
        raise TypeError(
            "torchopt optimizers are not supported (their update returns deltas and they do not "
            "compile); use the same optimizer from sbfunc.optim, e.g. sbfunc.optim.adam(1e-3), "
            "whose update equals torch.optim's"
        )
    if not (
        callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))
    ):
        raise TypeError(
            "optimizer must have init(params) and update(grads, state, params) -> "
            "(updates, state): a gradient transformation such as sbfunc.optim.adam(1e-3); "
            f"got {type(optimizer).__name__}"
        )


def _for_step(
    algorithms: Sequence[Algorithm], loss_fn: LossFn, per_sample: PerSample
) -> tuple[Algorithm, ...]:
    """Each algorithm bound to the step's loss and per-sample spec (a spec of its own that
    disagrees is refused there)."""
    for i, a in enumerate(algorithms):
        if not isinstance(a, Algorithm):
            raise TypeError(f"algorithms[{i}] must be an sbfunc.Algorithm, got {type(a).__name__}")
    return tuple(a.for_step(loss_fn=loss_fn, per_sample=per_sample) for a in algorithms)


def _microbatching(
    microbatching: Microbatching | None, legacy: dict[str, Any]
) -> Microbatching | None:
    """``microbatching``, checked, or 1.1's ``microbatches=``/``microbatch_size=`` folded in
    with a ``DeprecationWarning`` (removed in 1.3)."""
    unknown = sorted(set(legacy) - {"microbatches", "microbatch_size"})
    if unknown:
        raise TypeError(f"make_train_step() got unexpected keyword arguments {unknown}")
    if legacy:
        if microbatching is not None:
            raise TypeError("give microbatching=Microbatching(...) alone, without microbatches=")
        spelled = ", ".join(f"{k}={v!r}" for k, v in legacy.items())
        warnings.warn(
            f"make_train_step({spelled}) is now make_train_step(microbatching="
            "sbfunc.step.Microbatching(chunks=k) or Microbatching(size=m)) (sbfunc 1.2); the "
            f"old keywords are removed in {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=3,
        )
        chunks, size = legacy.get("microbatches"), legacy.get("microbatch_size")
        microbatching = None if chunks is None and size is None else Microbatching(chunks, size)
    if microbatching is None:
        return None
    if not isinstance(microbatching, Microbatching):
        raise TypeError(
            "microbatching must be an sbfunc.step.Microbatching (chunks=k or size=m) or None, "
            f"got {microbatching!r:.60}"
        )
    return check_microbatching(microbatching)


def _check_precision(precision: object, optimizer: GradientTransformation, nonfinite: str) -> None:
    """Raise for a ``precision`` out of its values, float16 without a loss scale, or a loss
    scale with ``nonfinite="allow"`` (which would apply the overflowed updates it skips)."""
    if precision == "amp_fp8":
        raise ValueError(
            "precision='amp_fp8' (Composer's FP8 through Transformer Engine) is not supported; "
            "precision must be one of 'fp32', 'amp_bf16', 'amp_fp16'"
        )
    if not isinstance(precision, str) or precision not in AUTOCAST:
        raise ValueError(
            f"precision must be one of 'fp32', 'amp_bf16', 'amp_fp16', got {precision!r}"
        )
    scaled = scales_loss(optimizer)
    if precision == "amp_fp16" and not scaled:
        raise ValueError(
            "precision='amp_fp16' needs dynamic loss scaling, or small float16 gradients "
            "flush to zero: wrap the optimizer, e.g. "
            "sbfunc.optim.dynamic_loss_scale(sbfunc.optim.adamw(1e-3)) (torch.amp.GradScaler's "
            "defaults), or use precision='amp_bf16', which needs none"
        )
    if scaled and nonfinite == "allow":
        raise ValueError(
            "a dynamic_loss_scale optimizer skips the updates that overflow, which "
            "nonfinite='allow' (apply every update, count nothing) contradicts; use "
            "nonfinite='skip' (the default: overflows are skipped and counted) or 'raise'"
        )
