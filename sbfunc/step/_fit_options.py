"""``fit``'s grouped options: what to evaluate and when (:class:`Evaluator`), where to save and
load checkpoints and when (:class:`Checkpointing`), and the 1.0 keywords they replace."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from sbfunc._namespace import REMOVED_IN
from sbfunc.engine import Duration
from sbfunc.step._evaluation import EvalFn

__all__ = ["Checkpointing", "Evaluator", "grouped_options"]

FilePath = str | os.PathLike[str]
"""A file's path, as ``open`` takes it."""


class Evaluator(NamedTuple):
    """What :func:`sbfunc.fit` evaluates, and how often (Composer's ``Evaluator`` with its
    ``eval_interval``).

    Attributes:
        data: a re-iterable of evaluation batches, or a mapping ``name -> re-iterable`` of
            several evaluation sets (``EVAL_START``/``EVAL_END`` fire once per set, and the
            metrics are a dict by name).
        fn: ``fn(params, buffers, batch) -> metrics``, a pytree of per-batch means, computed
            purely in eval mode (build it on :func:`sbfunc.module.eval_outputs` or
            :func:`sbfunc.predict`).
        every: a :class:`~sbfunc.engine.Duration` in epochs or steps (``None``: every epoch).

    Example:
        >>> ev = sbfunc.step.Evaluator([], lambda p, b, batch: {}, sbfunc.engine.Duration(steps=5))
        >>> ev.every
        Duration(epochs=None, steps=5)

    References:
        MosaicML Composer ``Evaluator`` and ``Trainer(eval_interval=...)``.
    """

    data: Iterable[Any] | Mapping[str, Iterable[Any]]
    fn: EvalFn
    every: Duration | None = None


class Checkpointing(NamedTuple):
    """Where :func:`sbfunc.fit` saves checkpoints and how often, and what it resumes from.

    Attributes:
        save_to: the checkpoint path, formatted with ``step`` and ``epoch``
            (``"ckpt/step{step}.pt"``; without fields each save replaces the last); ``None``:
            never save.
        every: a :class:`~sbfunc.engine.Duration` in epochs or steps (``None``: every epoch).
        load_from: a checkpoint to load into the state's structure before training
            (``None``: start from the given state).

    Example:
        >>> ckpt = sbfunc.step.Checkpointing("ckpt/s{step}.pt", sbfunc.engine.Duration(steps=100))
        >>> ckpt.every, ckpt.load_from
        (Duration(epochs=None, steps=100), None)

    References:
        MosaicML Composer ``Trainer(save_folder=..., save_interval=..., load_path=...)``.
    """

    save_to: FilePath | None = None
    every: Duration | None = None
    load_from: FilePath | None = None


_LEGACY = {
    "eval_data": ("evaluator", "Evaluator(data=...)"),
    "eval_fn": ("evaluator", "Evaluator(fn=...)"),
    "eval_every": ("evaluator", "Evaluator(every=...)"),
    "checkpoint": ("checkpointing", "Checkpointing(save_to=...)"),
    "save_every": ("checkpointing", "Checkpointing(every=...)"),
    "load_from": ("checkpointing", "Checkpointing(load_from=...)"),
}


def grouped_options(
    evaluator: Evaluator | None, checkpointing: Checkpointing | None, legacy: dict[str, Any]
) -> tuple[Evaluator | None, Checkpointing]:
    """``(evaluator, checkpointing)`` from ``fit``'s arguments, the 1.0 keywords (``eval_data``,
    ``eval_fn``, ``eval_every``, ``checkpoint``, ``save_every``, ``load_from``) folded in with
    a ``DeprecationWarning`` (removed in 1.3).

    Raises:
        TypeError: for an unknown keyword, a 1.0 keyword beside its group, or a group of the
            wrong type.
    """
    unknown = sorted(set(legacy) - set(_LEGACY))
    if unknown:
        raise TypeError(f"fit() got unexpected keyword arguments {unknown}")
    for name, (group, spelling) in _LEGACY.items():
        if name not in legacy:
            continue
        if (evaluator if group == "evaluator" else checkpointing) is not None:
            raise TypeError(f"pass {name}= inside {group}=sbfunc.step.{spelling}, not beside it")
        warnings.warn(
            f"fit({name}=...) is now fit({group}=sbfunc.step.{spelling}) (sbfunc 1.1); the "
            f"old keyword is removed in {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=3,
        )
    if any(k in legacy for k in ("eval_data", "eval_fn", "eval_every")):
        data, fn = legacy.get("eval_data"), legacy.get("eval_fn")
        evaluator = Evaluator(data, fn, legacy.get("eval_every"))  # type: ignore[arg-type]
    if any(k in legacy for k in ("checkpoint", "save_every", "load_from")):
        checkpointing = Checkpointing(
            legacy.get("checkpoint"), legacy.get("save_every"), legacy.get("load_from")
        )
    if evaluator is not None and not isinstance(evaluator, Evaluator):
        raise TypeError(f"evaluator must be an sbfunc.step.Evaluator, got {evaluator!r:.60}")
    if checkpointing is None:
        return evaluator, Checkpointing()
    if not isinstance(checkpointing, Checkpointing):
        raise TypeError(
            f"checkpointing must be an sbfunc.step.Checkpointing, got {checkpointing!r:.60}"
        )
    return evaluator, checkpointing
