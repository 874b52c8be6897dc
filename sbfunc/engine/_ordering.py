"""Ordering passes: plain functions ``(algorithms, event) -> list`` (on :mod:`sbfunc.engine`).

A training step runs its passes **once per event, when it is built**, on every algorithm that
can match that event; each step applies, in that order, the ones that matched. A pass never
mutates its input; it returns a new list of the same algorithms.

:data:`DEFAULT_PASSES` is one rule, :func:`order_by_phase` (sequence-length changes, then
sample selection, then the rest first-in-last-out on ``AFTER_*`` events, then layer-norm
fusion), and :func:`warn_if_multiple_loss_interpolation`. Composer's own passes are here too
(:data:`COMPOSER_PASSES`, in Composer's order): there the FILO reversal of the ``AFTER_*`` events
undoes ``sort_selective_backprop_first``, so on ``AFTER_DATALOADER`` Selective Backprop runs
*last* and scores a batch that CutOut/MixUp already augmented (Composer 0.32.1 turns
``[CutOut, ProgressiveResizing, SelectiveBackprop]`` into
``[ProgressiveResizing, CutOut, SelectiveBackprop]``). Sample selection must see the raw batch,
so sbfunc's rule puts selectors in their own phase instead of patching the order afterwards.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sbfunc.engine._algorithm import FLAGS, Algorithm
from sbfunc.engine._events import Event
from sbfunc.validation import check_int

__all__ = [
    "COMPOSER_PASSES",
    "DEFAULT_PASSES",
    "MultipleLossInterpolationWarning",
    "Pass",
    "order_by_phase",
    "phase",
    "register_pass",
    "set_filo_order",
    "sort_fused_layernorm_last",
    "sort_selective_backprop_first",
    "sort_to_back",
    "sort_to_front",
    "warn_if_multiple_loss_interpolation",
]

T = TypeVar("T")
Pass = Callable[[Sequence[Algorithm], Event], list[Algorithm]]
"""An ordering pass: ``(matched algorithms, event) -> new list``."""

Selector = type | tuple[type, ...] | Callable[[Any], Any]


_FLAG_GETTERS = {flag: operator.attrgetter(flag) for flag in FLAGS}
_FILO_EVENTS = frozenset(e for e in Event if e.value.startswith("after_"))


class MultipleLossInterpolationWarning(UserWarning):
    """Two or more algorithms that interpolate the loss matched the same event.

    Example:
        >>> import warnings
        >>> from sbfunc.engine import Event
        >>> from sbfunc.engine import MultipleLossInterpolationWarning
        >>> from sbfunc.testing import Toy
        >>> algs = [Toy(name="a", interpolate_loss=True), Toy(name="b", interpolate_loss=True)]
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", MultipleLossInterpolationWarning)
        ...     try:
        ...         sbfunc.engine.warn_if_multiple_loss_interpolation(algs, Event.BEFORE_LOSS)
        ...     except MultipleLossInterpolationWarning as w:
        ...         print(w)
        2 algorithms interpolate the loss on BEFORE_LOSS (a, b); ...

    References:
        MosaicML Composer ``warn_if_multiple_loss_interpolation`` (which warns with
        ``NotIntendedUseWarning``); Python ``warnings.simplefilter(action, category)``.
    """


def _predicate(selector: Selector) -> Callable[[Any], Any]:
    if isinstance(selector, type) or (
        isinstance(selector, tuple) and all(isinstance(c, type) for c in selector)
    ):
        return lambda x: isinstance(x, selector)
    if callable(selector):
        return selector
    raise TypeError(
        f"predicate_or_cls must be a class, a tuple of classes or a callable, got {selector!r}"
    )


def _split(xs: Sequence[T], selector: Selector) -> tuple[list[T], list[T]]:
    pred = _predicate(selector)
    hit = [x for x in xs if pred(x)]
    if not hit:
        return hit, list(xs)
    return hit, [x for x in xs if not pred(x)]


def sort_to_front(xs: Sequence[T], predicate_or_cls: Selector) -> list[T]:
    """Stably move the items that are instances of a class (or satisfy a predicate) to the front.

    Args:
        xs: the items (not modified).
        predicate_or_cls: a class, a tuple of classes (``isinstance``) or ``item -> bool``.

    Returns:
        A new list: the selected items, then the others, each group in input order.

    Raises:
        TypeError: if ``predicate_or_cls`` is neither a class, a tuple of classes nor callable.

    Example:
        >>> sbfunc.engine.sort_to_front([1, "b", 3], str)
        ['b', 1, 3]
        >>> sbfunc.engine.sort_to_front([1, 2, 3, 4], lambda x: x % 2 == 0)
        [2, 4, 1, 3]

    References:
        MosaicML Composer ``composer.core.passes.sort_to_front``.
    """
    hit, miss = _split(xs, predicate_or_cls)
    return hit + miss


def sort_to_back(xs: Sequence[T], predicate_or_cls: Selector) -> list[T]:
    """Stably move the items that are instances of a class (or satisfy a predicate) to the back.

    Args:
        xs: the items (not modified).
        predicate_or_cls: a class, a tuple of classes (``isinstance``) or ``item -> bool``.

    Returns:
        A new list: the other items, then the selected ones, each group in input order.

    Raises:
        TypeError: if ``predicate_or_cls`` is neither a class, a tuple of classes nor callable.

    Example:
        >>> sbfunc.engine.sort_to_back([1, "b", 3], str)
        [1, 3, 'b']

    References:
        MosaicML Composer ``composer.core.passes.sort_to_back``.
    """
    hit, miss = _split(xs, predicate_or_cls)
    return miss + hit


def _flag_front(algorithms: Sequence[Algorithm], flag: str, front: bool) -> list[Algorithm]:
    """Stable partition by a declared flag (the hot path of the default passes)."""
    get = _FLAG_GETTERS[flag]
    if len(algorithms) < 2 or not any(map(get, algorithms)):
        return list(algorithms)
    hit = [a for a in algorithms if get(a)]
    miss = [a for a in algorithms if not get(a)]
    return hit + miss if front else miss + hit


def sort_selective_backprop_first(
    algorithms: Sequence[Algorithm], event: Event
) -> list[Algorithm]:
    """Put the sample-selecting algorithms (``selects_samples``) first, stably.

    Args:
        algorithms: the matched algorithms (not modified).
        event: the event (unused: every event).

    Returns:
        A new, reordered list.

    Example:
        >>> from sbfunc.engine import Event
        >>> from sbfunc.testing import Toy
        >>> algs = [Toy(name="aug"), Toy(name="sb", selects_samples=True)]
        >>> [a.name for a in sbfunc.engine.sort_selective_backprop_first(algs, Event.INIT)]
        ['sb', 'aug']

    References:
        MosaicML Composer ``sort_selective_backprop_first``.
    """
    return _flag_front(algorithms, "selects_samples", True)


def sort_fused_layernorm_last(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """Put the algorithms that fuse LayerNorms (``fuses_layernorm``) last, stably.

    They must run after algorithms that add LayerNorms, so that all of them get fused.

    Args:
        algorithms: what matched the event; read, never changed.
        event: not consulted (fusers go last on all events).

    Returns:
        The other algorithms, then the fusers, each group in its incoming order.

    Example:
        >>> from sbfunc.engine import Event
        >>> from sbfunc.testing import Toy
        >>> algs = [Toy(name="fuse", fuses_layernorm=True), Toy(name="glu")]
        >>> [a.name for a in sbfunc.engine.sort_fused_layernorm_last(algs, Event.INIT)]
        ['glu', 'fuse']

    References:
        MosaicML Composer ``sort_fused_layernorm_last``.
    """
    return _flag_front(algorithms, "fuses_layernorm", False)


def set_filo_order(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """Reverse the order on events whose value starts with ``after_`` (first in, last out).

    An algorithm that changes something on ``BEFORE_X`` then undoes it on ``AFTER_X`` (label
    smoothing) nests correctly with the others. Only the six ``AFTER_*`` events are reversed,
    as in Composer; ``*_END`` and ``EVAL_AFTER_*`` events keep their order.

    Args:
        algorithms: the matched algorithms (not modified).
        event: the event.

    Returns:
        A new list, reversed on ``AFTER_*`` events.

    Example:
        >>> from sbfunc.engine import Event
        >>> sbfunc.engine.set_filo_order([1, 2, 3], Event.AFTER_LOSS)
        [3, 2, 1]
        >>> sbfunc.engine.set_filo_order([1, 2, 3], Event.BATCH_END)
        [1, 2, 3]

    References:
        MosaicML Composer ``set_filo_order``.
    """
    if event in _FILO_EVENTS:
        return algorithms[::-1] if type(algorithms) is list else list(reversed(algorithms))
    return list(algorithms)


def phase(algorithm: Algorithm) -> int:
    """An algorithm's phase in every event's order, from its declared flags.

    0: it changes the sequence length (``changes_sequence_length``); 1: it selects samples
    (``selects_samples``); 3: it fuses layer norms (``fuses_layernorm``); 2: everything else.

    Example:
        >>> from sbfunc.testing import Toy
        >>> [sbfunc.engine.phase(a) for a in (Toy(selects_samples=True), Toy())]
        [1, 2]
    """
    if algorithm.changes_sequence_length:
        return 0
    if algorithm.selects_samples:
        return 1
    return 3 if algorithm.fuses_layernorm else 2


def order_by_phase(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """The one ordering rule: by :func:`phase`, then by place in the list, first in last out.

    Sequence-length changes come first (Selective Backprop scores rows at the length they are
    trained at), then the sample selectors (they score the raw batch, and everything after
    them touches only the rows they keep), then every other algorithm, then the layer-norm
    fusers. Within the first two phases the list order holds on every event; within the
    others it is reversed on the ``AFTER_*`` events (first in, last out: an algorithm that
    changes something on ``BEFORE_X`` and undoes it on ``AFTER_X`` nests with the others).
    The result depends only on what the algorithms are, so ordering the whole list once and
    keeping the ones that matched equals ordering the matched ones.

    Args:
        algorithms: the algorithms (not modified).
        event: the event (``AFTER_*`` events reverse the last two phases).

    Returns:
        A new list.

    Example:
        >>> from sbfunc.engine import Event
        >>> from sbfunc.testing import Toy
        >>> algs = [Toy(name="cutout"), Toy(name="mixup"), Toy(name="sb", selects_samples=True)]
        >>> [a.name for a in sbfunc.engine.order_by_phase(algs, Event.AFTER_DATALOADER)]
        ['sb', 'mixup', 'cutout']
        >>> [a.name for a in sbfunc.engine.order_by_phase(algs, Event.BEFORE_FORWARD)]
        ['sb', 'cutout', 'mixup']

    References:
        MosaicML Composer ``core.passes`` (``sort_selective_backprop_first``,
        ``set_filo_order``, ``sort_fused_layernorm_last``), whose FILO reversal runs Selective
        Backprop last on ``AFTER_DATALOADER``; Jiang et al. 2019 (Selective Backprop).
    """
    filo = event in _FILO_EVENTS

    def key(item: tuple[int, Algorithm]) -> tuple[int, int]:
        i, alg = item
        p = phase(alg)
        return p, (-i if filo and p >= 2 else i)

    return [alg for _, alg in sorted(enumerate(algorithms), key=key)]


def warn_if_multiple_loss_interpolation(
    algorithms: Sequence[Algorithm], event: Event
) -> list[Algorithm]:
    """Warn when two or more matched algorithms interpolate the loss; never reorder.

    Args:
        algorithms: the matched algorithms (not modified).
        event: the event (named in the warning).

    Returns:
        ``list(algorithms)``, same order.

    Warns:
        MultipleLossInterpolationWarning: if at least two have ``interpolate_loss``.

    Example:
        >>> import warnings
        >>> from sbfunc.engine import Event
        >>> from sbfunc.testing import Toy
        >>> algs = [Toy(name="mixup", interpolate_loss=True), Toy(name="cutmix",
        ...                                                     interpolate_loss=True)]
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = sbfunc.engine.warn_if_multiple_loss_interpolation(algs, Event.BEFORE_LOSS)
        >>> len(caught)
        1

    References:
        MosaicML Composer ``warn_if_multiple_loss_interpolation``.
    """
    if len(algorithms) < 2 or sum(map(_FLAG_GETTERS["interpolate_loss"], algorithms)) < 2:
        return list(algorithms)
    names = [a.name for a in algorithms if a.interpolate_loss]
    warnings.warn(
        f"{len(names)} algorithms interpolate the loss on {event.name} ({', '.join(names)}); "
        "their combination may behave unexpectedly",
        MultipleLossInterpolationWarning,
        stacklevel=2,
    )
    return list(algorithms)


DEFAULT_PASSES: tuple[Pass, ...] = (order_by_phase, warn_if_multiple_loss_interpolation)
"""The passes a step uses by default: the one ordering rule, then the warning."""

COMPOSER_PASSES: tuple[Pass, ...] = (
    sort_selective_backprop_first,
    sort_fused_layernorm_last,
    set_filo_order,
    warn_if_multiple_loss_interpolation,
)
"""Composer 0.32.1's default passes, in its order, for runs that must order exactly as it does
(its FILO reversal runs Selective Backprop last on ``AFTER_DATALOADER``)."""


def register_pass(
    passes: Sequence[Pass], new_pass: Pass, index: int | None = None
) -> tuple[Pass, ...]:
    """A new tuple of passes with ``new_pass`` inserted at ``index`` (appended if ``None``).

    Args:
        passes: the current passes (not modified), e.g. :data:`DEFAULT_PASSES`.
        new_pass: ``(algorithms, event) -> list``.
        index: the position, in ``[-len(passes), len(passes)]`` (``list.insert`` semantics).

    Returns:
        The new passes.

    Raises:
        TypeError: if ``new_pass`` is not callable or ``index`` is not an int.
        ValueError: if ``index`` is out of range.

    Example:
        >>> def last_first(algorithms, event):
        ...     return list(algorithms[-1:]) + list(algorithms[:-1])
        >>> passes = sbfunc.engine.register_pass(sbfunc.engine.DEFAULT_PASSES, last_first, 0)
        >>> passes[0] is last_first, len(passes) == len(sbfunc.engine.DEFAULT_PASSES) + 1
        (True, True)

    References:
        MosaicML Composer ``Engine.register_pass``.
    """
    if not callable(new_pass):
        raise TypeError(f"new_pass must be callable (algorithms, event) -> list, got {new_pass!r}")
    out = list(passes)
    if index is None:
        out.append(new_pass)
    else:
        check_int(index, "index", low=-len(out), high=len(out), fix="or None to append")
        out.insert(index, new_pass)
    return tuple(out)
