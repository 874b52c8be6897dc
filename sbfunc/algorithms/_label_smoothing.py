"""Label smoothing: mix the one-hot targets with the uniform distribution (Composer's
algorithm and its pure target transform)."""

from __future__ import annotations

import torch

from sbfunc.batch import check_field, extract, replace
from sbfunc.engine import Algorithm, Context, Event
from sbfunc.validation import check_fraction, check_int

__all__ = ["LabelSmoothing", "smooth_labels", "soft_targets"]


def soft_targets(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class indices to one-hot float targets with the class axis second; floats pass through.

    ``[N]`` becomes ``[N, C]`` and per-pixel (per-token) indices ``[N, *dims]`` become
    ``[N, C, *dims]``, the layout ``torch.nn.functional.cross_entropy`` takes for probability
    targets. An index outside ``[0, C)`` (an ignore label such as ``-1`` or ``255``) gives an
    all-zero target, as Composer's ``ensure_targets_one_hot`` does for negative labels; indices
    are not checked otherwise (that would need a device sync). Floating-point targets are
    returned as they are.

    Args:
        targets: integer class indices ``[N, *dims]``, or float targets.
        num_classes: the number of classes ``C``, >= 1.

    Returns:
        Float targets (the default dtype for one-hot ones).

    Raises:
        ValueError: if ``num_classes < 1``.

    Example:
        >>> sbfunc.algorithms.soft_targets(torch.tensor([1, 0]), 2)
        tensor([[0., 1.], [1., 0.]])
        >>> sbfunc.algorithms.soft_targets(torch.zeros(2, 4, 5, dtype=torch.long), 3).shape
        torch.Size([2, 3, 4, 5])

    References:
        PyTorch ``torch.nn.functional.cross_entropy`` (class-probability targets
        ``[N, C, d1, ...]``); MosaicML Composer ``composer.loss.utils.ensure_targets_one_hot``.
    """
    check_int(num_classes, "num_classes", low=1)
    if targets.dtype.is_floating_point:
        return targets
    classes = torch.arange(num_classes, device=targets.device)
    classes = classes.view(1, num_classes, *([1] * (targets.dim() - 1)))
    return (targets.unsqueeze(1) == classes).to(torch.get_default_dtype())


def smooth_labels(targets: torch.Tensor, smoothing: float, num_classes: int) -> torch.Tensor:
    """Label smoothing: ``(1 - smoothing) * onehot(y) + smoothing / C`` (soft targets in).

    Index targets ``[N, *dims]`` become ``[N, C, *dims]`` (see :func:`soft_targets`); soft
    targets must already have the class axis second.

    Example:
        >>> sbfunc.algorithms.smooth_labels(torch.tensor([0]), 0.1, 2)
        tensor([[0.9500, 0.0500]])
        >>> sbfunc.algorithms.smooth_labels(torch.zeros(1, 4, 4, dtype=torch.long), 0.1, 2).shape
        torch.Size([1, 2, 4, 4])

    References:
        Szegedy et al. 2016, "Rethinking the Inception Architecture for Computer Vision";
        MosaicML Composer ``smooth_labels``.
    """
    check_fraction(smoothing, "smoothing")
    return (1.0 - smoothing) * soft_targets(targets, num_classes) + smoothing / num_classes


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
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), batch=batch)
        >>> ctx = ls.apply(sbfunc.Event.BEFORE_LOSS, ctx)
        >>> ctx.batch[1]
        tensor([[0.0500, 0.9500]])
        >>> ls.apply(sbfunc.Event.AFTER_LOSS, ctx).batch[1]
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

    def apply(self, event: Event, ctx: Context) -> Context:
        if event == Event.BEFORE_LOSS:
            y = extract(ctx.batch, self.target, "target")
            smoothed = smooth_labels(y, self.smoothing, self.num_classes)
            return ctx.replace(batch=replace(ctx.batch, self.target, smoothed), scratch=y)
        if ctx.scratch is None:
            raise RuntimeError(f"{self.name}: AFTER_LOSS without the matching BEFORE_LOSS")
        return ctx.replace(batch=replace(ctx.batch, self.target, ctx.scratch), scratch=None)
