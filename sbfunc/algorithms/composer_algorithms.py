"""CutOut, MixUp and LabelSmoothing as algorithms (Composer's, in functional form)."""

from __future__ import annotations

from sbfunc.algorithms._checks import check_field
from sbfunc.algorithms.augment import cutout_batch, mixup_batch, smooth_labels
from sbfunc.batch import extract, replace
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_bool, check_fraction, check_int, check_real

__all__ = ["CutOut", "LabelSmoothing", "MixUp"]


class CutOut(Algorithm):
    """Zero random squares of the input on ``AFTER_DATALOADER`` (see
    :func:`sbfunc.algorithms.cutout_batch`).

    Runs after any sample-selecting algorithm on that event (default passes), so it augments
    only the kept rows and never the rows Selective Backprop scores. ``uniform_sampling`` makes
    every pixel equally likely to be masked (Composer's option).

    Example:
        >>> co = sbfunc.algorithms.CutOut(length=0.5)
        >>> batch = (torch.ones(2, 1, 4, 4), torch.zeros(2))
        >>> state = sbfunc.Context(sbfunc.random.key(0), batch=batch)
        >>> int((co.apply(sbfunc.Event.AFTER_DATALOADER, state).batch[0] == 0).sum())
        8

    References:
        DeVries and Taylor 2017; MosaicML Composer ``CutOut``.
    """

    def __init__(
        self,
        num_holes: int = 1,
        length: float = 0.5,
        uniform_sampling: bool = False,
        *,
        input: int | str = 0,
    ) -> None:
        self.num_holes = check_int(num_holes, "num_holes", low=1)
        self.length = check_fraction(length, "length", open_low=True)
        self.uniform_sampling = check_bool(uniform_sampling, "uniform_sampling")
        self.input = check_field("input", input)

    events = frozenset({Event.AFTER_DATALOADER})

    def match(self, event: Event, state: Context) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: Context) -> Context:
        x = extract(state.batch, self.input, "input")
        x = cutout_batch(
            x,
            key=state.key,
            num_holes=self.num_holes,
            length=self.length,
            uniform_sampling=self.uniform_sampling,
        )
        return state.replace(batch=replace(state.batch, self.input, x))


class MixUp(Algorithm):
    """Mix random pairs of inputs and their targets on ``BEFORE_FORWARD``.

    Composer's coefficient: ``mixing = min(z, 1 - z)``, ``z ~ Beta(alpha, alpha)``, the weight
    of the partner, so the original row dominates; ``alpha = 0`` leaves the inputs unchanged.
    The loss on the mixed soft targets is Composer's interpolated loss for cross-entropy (see
    :func:`sbfunc.algorithms.mixup_batch`), so it declares ``interpolate_loss = True`` and the
    ``warn_if_multiple_loss_interpolation`` pass can flag conflicting algorithms. Per-pixel
    index targets ``[N, H, W]`` become soft targets ``[N, C, H, W]``.

    Example:
        >>> mu = sbfunc.algorithms.MixUp(alpha=0.2, num_classes=3)
        >>> state = sbfunc.Context(sbfunc.random.key(0),
        ...                      batch=(torch.randn(4, 2), torch.tensor([0, 1, 2, 0])))
        >>> mu.apply(sbfunc.Event.BEFORE_FORWARD, state).batch[1].shape
        torch.Size([4, 3])

    References:
        Zhang et al. 2018; MosaicML Composer ``MixUp``.
    """

    interpolate_loss = True

    def __init__(
        self, alpha: float = 0.2, *, num_classes: int, input: int | str = 0, target: int | str = 1
    ) -> None:
        self.alpha = check_real(alpha, "alpha", low=0)
        self.num_classes = check_int(num_classes, "num_classes", low=1)
        self.input = check_field("input", input)
        self.target = check_field("target", target)

    events = frozenset({Event.BEFORE_FORWARD})

    def match(self, event: Event, state: Context) -> bool:
        return event == Event.BEFORE_FORWARD

    def apply(self, event: Event, state: Context) -> Context:
        x = extract(state.batch, self.input, "input")
        y = extract(state.batch, self.target, "target")
        xm, ym, _ = mixup_batch(
            x, y, key=state.key, alpha=self.alpha, num_classes=self.num_classes
        )
        return state.replace(batch=replace(replace(state.batch, self.input, xm), self.target, ym))


class LabelSmoothing(Algorithm):
    """Smooth the targets on ``BEFORE_LOSS`` and restore them on ``AFTER_LOSS``.

    Index targets ``[N, *dims]`` (classes, or per-pixel classes ``[N, H, W]``) become soft
    targets with the class axis second, ``[N, C, *dims]`` (see
    :func:`sbfunc.algorithms.smooth_labels`).

    The original targets wait in the algorithm's per-batch ``scratch`` between the two events
    (scratch lives for one step, so nothing of it is checkpointed). With the FILO order of
    the default passes, when several algorithms change targets on ``BEFORE_LOSS``, they
    restore them in reverse on ``AFTER_LOSS``.

    Example:
        >>> ls = sbfunc.algorithms.LabelSmoothing(0.1, num_classes=2)
        >>> batch = (torch.zeros(1, 3), torch.tensor([1]))
        >>> state = sbfunc.Context(sbfunc.random.key(0), batch=batch)
        >>> state = ls.apply(sbfunc.Event.BEFORE_LOSS, state)
        >>> state.batch[1]
        tensor([[0.0500, 0.9500]])
        >>> ls.apply(sbfunc.Event.AFTER_LOSS, state).batch[1]
        tensor([1])

    References:
        Szegedy et al. 2016; MosaicML Composer ``LabelSmoothing``.
    """

    uses_key = False

    def __init__(self, smoothing: float = 0.1, *, num_classes: int, target: int | str = 1) -> None:
        self.smoothing = check_fraction(smoothing, "smoothing")
        self.num_classes = check_int(num_classes, "num_classes", low=1)
        self.target = check_field("target", target)

    events = frozenset({Event.BEFORE_LOSS, Event.AFTER_LOSS})

    def match(self, event: Event, state: Context) -> bool:
        return event in (Event.BEFORE_LOSS, Event.AFTER_LOSS)

    def apply(self, event: Event, state: Context) -> Context:
        if event == Event.BEFORE_LOSS:
            y = extract(state.batch, self.target, "target")
            smoothed = smooth_labels(y, self.smoothing, self.num_classes)
            return state.replace(batch=replace(state.batch, self.target, smoothed), scratch=y)
        if state.scratch is None:
            raise RuntimeError(f"{self.name}: AFTER_LOSS without the matching BEFORE_LOSS")
        return state.replace(batch=replace(state.batch, self.target, state.scratch), scratch=None)
