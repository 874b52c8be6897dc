"""Drop-in, fixed versions of Composer's functional Selective Backprop API."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn

from sbfunc.module import accepts_reduction, module_mode, reduce_per_sample
from sbfunc.policies import rank_power_indices
from sbfunc.score import check_scale_factor, downsample
from sbfunc.select import check_keep

__all__ = ["select_using_loss"]


# Composer's own messages, raised where Composer raises (code may match on them).
INPUT_RANK_ERROR = "Input must be 3D, 4D, or 5D if scale_factor != 1, got {}"
SCALE_FACTOR_ERROR = "scale_factor must be <= 1"
REDUCTION_ERROR = "Loss function `loss_fun` must take a keyword argument `reduction`."
CALLABLE_ERROR = "Loss function must be callable"
TENSOR_ERROR = (
    "select_using_loss takes {} as a tensor (Composer's API), got a {}; for a dict or any "
    "other pytree batch take the pure path: scores = sbfunc.score.score_losses(loss_fn, params, "
    "buffers, batch), then a policy (sel, _ = sbfunc.policies.rank_power(keep).select(scores, "
    "sbfunc.types.EmptyState(), key=key)), then sbfunc.batch.take(batch, sel.indices)"
)


MODULE_LOSS_NOTE = (
    "loss_fun is called as loss_fun(output, target, reduction='none'); a loss module such as "
    "nn.CrossEntropyLoss() takes no reduction= argument (Composer refuses it too): pass the "
    "functional form, e.g. torch.nn.functional.cross_entropy"
)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_loss_fun(loss_fun: object) -> None:
    """Composer's two checks of ``loss_fun``, with its messages; a loss module is judged by
    its ``forward`` (Composer reads the module's ``__call__``, ``(*args, **kwargs)``, and
    refuses every module), so ``nn.CrossEntropyLoss()`` is refused as in Composer, with a note
    naming the functional form."""
    if not callable(loss_fun):
        raise TypeError(CALLABLE_ERROR)
    module = loss_fun if isinstance(loss_fun, nn.Module) else None
    if not accepts_reduction(loss_fun if module is None else module.forward):
        error = TypeError(REDUCTION_ERROR)
        if module is not None and sys.version_info >= (3, 11):
            error.add_note(MODULE_LOSS_NOTE)  # str(error) stays Composer's message
        raise error


def select_using_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    model: Callable[[torch.Tensor], torch.Tensor],
    loss_fun: Callable[..., torch.Tensor],
    keep: float = 0.5,
    scale_factor: float = 1,
    *,
    generator: torch.Generator | None = None,
    train: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prune ``(input, target)`` to the rows Selective Backprop keeps (Composer-compatible).

    Runs ``model`` without gradients on the optionally downsampled input, ranks
    ``loss_fun(output, target, reduction='none')`` and draws ``max(1, floor(keep*N))`` rows
    from Composer's rank-power law (see :func:`sbfunc.policies.rank_power`). Unlike Composer,
    the draw uses ``generator`` (a ``torch.Generator`` on the input's device) instead of the
    global numpy RNG, rows come back in batch order, ties are broken at random, non-finite
    losses rank below every finite one (:mod:`sbfunc.select`) and ``keep``/
    ``scale_factor`` are validated. ``generator=None`` draws from torch's default generator,
    which ``torch.manual_seed`` seeds.

    **Scoring mode.** ``train=None`` (the default) scores in the model's current train/eval
    mode, as Composer does: in train mode dropout adds noise to the ranking and BatchNorm
    updates its running statistics with the scoring pass. ``train=False`` scores in eval mode
    (deterministic scores, running statistics untouched) and ``train=True`` in train mode; the
    model's mode, submodule by submodule, is restored afterwards.

    Args:
        input: input tensor ``[N, ...]``.
        target: target tensor ``[N, ...]``.
        model: callable mapping input to output.
        loss_fun: ``loss_fun(output, target, reduction='none')`` returning per-sample losses
            (a function such as ``torch.nn.functional.cross_entropy``). A loss module whose
            ``forward`` takes no ``reduction`` (``nn.CrossEntropyLoss()``, whatever its own
            ``reduction``) is refused with Composer's message, as Composer refuses it.
        keep: fraction of rows kept, in (0, 1].
        scale_factor: spatial scale of the scoring input in (0, 1]; requires a 3-D/4-D/5-D
            input when not 1.
        generator: the source of randomness.
        train: the model's mode for the scoring forward (``None``: leave it as it is); needs
            an ``nn.Module`` model when not ``None``.

    Returns:
        ``(input[idx], target[idx])`` with ``idx`` sorted ascending.

    Raises:
        ValueError: if ``scale_factor != 1`` and the input is not 3-D/4-D/5-D, or
            ``scale_factor > 1`` (both with Composer's messages, checked in Composer's order);
            then if ``scale_factor`` is NaN or ``<= 0``, or ``keep`` is not in (0, 1].
        TypeError: if ``loss_fun`` is not callable or does not accept ``reduction``, a loss
            module such as ``nn.CrossEntropyLoss()`` included (Composer's messages, ``"Loss
            function must be callable"`` and ``"Loss function `loss_fun` must take a keyword
            argument `reduction`."``, the latter with a note naming the functional form for a
            module on Python 3.11+); then if ``input`` or ``target`` is
            not a tensor (a dict batch: the message gives the pure path,
            ``sbfunc.score.score_losses`` -> a policy -> ``sbfunc.batch.take``), if
            ``scale_factor`` or ``keep`` is not a number, or ``train`` is not ``None``/a bool or
            is given for a model that is not an ``nn.Module``.

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        >>> g = torch.Generator().manual_seed(0)
        >>> xs, ys = sbfunc.compat.select_using_loss(
        ...     x, y, model, torch.nn.functional.cross_entropy, keep=0.5, generator=g)
        >>> xs.shape, ys.shape
        (torch.Size([4, 4]), torch.Size([4]))
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.5))
        >>> _ = sbfunc.compat.select_using_loss(
        ...     x, y, net, torch.nn.functional.cross_entropy, generator=g, train=False)
        >>> net.training  # scored in eval mode, then restored
        True

    References:
        Jiang et al. 2019; MosaicML Composer ``select_using_loss``.
    """
    # Composer's checks with Composer's messages, in Composer's order, then ours.
    if scale_factor != 1 and isinstance(input, torch.Tensor) and input.dim() not in (3, 4, 5):
        raise ValueError(INPUT_RANK_ERROR.format(input.dim()))
    if _is_real(scale_factor) and scale_factor > 1:
        raise ValueError(SCALE_FACTOR_ERROR)
    _check_loss_fun(loss_fun)
    for name, value in (("input", input), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(TENSOR_ERROR.format(name, type(value).__name__))
    scale_factor = check_scale_factor(scale_factor)  # a number, not NaN, > 0
    keep = check_keep(keep)
    if train is not None and not isinstance(train, bool):
        raise TypeError(f"train must be None, True or False, got {train!r}")
    if train is not None and not isinstance(model, nn.Module):
        raise TypeError(
            f"train={train} sets the scoring mode of an nn.Module, but model is a "
            f"{type(model).__name__}; pass train=None for a plain callable"
        )

    with torch.no_grad():
        scored = downsample(input, scale_factor)
        if isinstance(model, nn.Module):
            with module_mode(model, train):
                outputs = model(scored)
        else:
            outputs = model(scored)
        losses = loss_fun(outputs, target, reduction="none")
        n, dev = input.shape[0], input.device
        tie_noise = torch.randint(0, 2**32, (n,), generator=generator, device=dev)
        u = torch.rand(n, generator=generator, device=dev)
        idx = rank_power_indices(reduce_per_sample(losses, n), keep, tie_noise, u)
    return input[idx], target[idx]
