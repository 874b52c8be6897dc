"""Pure transforms of a per-sample loss function into per-sample gradient quantities.

Each transform takes a :class:`~sbfunc.types.LossFn` and returns a
:class:`PerSampleTransform`, ``f(params, buffers, batch, *, subsampling=None, chunk_size=None,
key=None)``, the one shape of every transform of :mod:`sbfunc.per_sample` (the curvature ones
too):

* ``subsampling``: indices of the samples to use (1-D, in ``[0, N)``); since samples are
  independent the quantities are computed on ``take(batch, subsampling)`` only, so the cost
  scales with the subset. Order and repeats are kept, as BackPACK's ``subsampling``: row ``i``
  of a per-sample result is sample ``subsampling[i]``, and a repeated index counts once per
  position in sums and variances.
* ``chunk_size``: process at most this many samples per forward/backward to bound memory.
* ``key``: the draws of a Monte-Carlo transform (``sqrt_ggn_mc``, ``diag_ggn_mc``, ...), which
  requires it; an exact transform draws nothing and ignores it, so one call serves both.
* ``wrt`` (at construction): parameter names or module prefixes to differentiate; the others
  are frozen (constants) and absent from the results.
* ``per_sample`` (at construction): which leaves of the batch are per-sample
  (:data:`sbfunc.types.PerSample`), for batches the default rule misreads.

The ``params`` and ``buffers`` given to a transform of a :class:`~sbfunc.module.ModuleLoss` are
checked against its module (names and shapes, :func:`sbfunc.module.check_state`) before any
forward; a plain loss function is not checked.

Gradients are those of each sample's **own** loss ``loss_fn(...)[i]`` (unscaled). BackPACK
differentiates the batch loss, usually the mean ``(1/N) sum_i loss_i`` over the *whole* batch
``N`` (also when sub-sampling), so under mean reduction: ``grad_batch = batch_grad / N``,
``batch_l2 = batch_l2_grad / N^2``, ``sum_grad_squared = ours / N^2`` and
``variance = ours / N^2`` (with a sum reduction they are equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from sbfunc.batch import batch_size, check_per_sample
from sbfunc.module import check_loss_fn
from sbfunc.per_sample._engine import Stat, check_wrt, compute
from sbfunc.random import Key
from sbfunc.types import LossFn, Params, PerSample

__all__ = [
    "PerSampleTransform",
    "SquaredNorms",
    "batch_grad",
    "batch_l2_grad",
    "sum_grad_squared",
    "variance",
]

T_co = TypeVar("T_co", covariant=True)


class PerSampleTransform(Protocol[T_co]):
    """The function every per-sample transform returns:
    ``f(params, buffers, batch, *, subsampling=None, chunk_size=None, key=None) -> T``.

    Its arguments and result are documented on :meth:`__call__`. A Monte-Carlo transform
    (:func:`~sbfunc.per_sample.sqrt_ggn_mc`, ...) requires ``key``; the exact ones ignore it.

    Example:
        >>> from sbfunc.per_sample import batch_grad
        >>> f = batch_grad(lambda p, b, x: (x * p["w"]).sum(1))
        >>> f({"w": torch.zeros(2)}, {}, torch.eye(2), subsampling=[1])["w"]
        tensor([[0., 1.]])

    References:
        Dangel et al. 2020, "BackPACK" (its extensions' quantities, with ``subsampling``);
        JAX ``jax.random`` (a key passed where randomness is drawn).
    """

    def __call__(
        self,
        params: Params,
        buffers: Params,
        batch: Any,
        /,
        *,
        subsampling: Sequence[int] | torch.Tensor | None = None,
        chunk_size: int | None = None,
        key: Key | None = None,
    ) -> T_co:
        """Compute the quantity for the selected samples.

        Args:
            params: parameter dict (e.g. from :func:`sbfunc.split_module`); never modified.
            buffers: buffer dict.
            batch: any pytree batch of ``N`` samples.
            subsampling: indices of the samples to use (1-D, in ``[0, N)``; order and
                repeats kept: row ``i`` is sample ``subsampling[i]``), or ``None``.
            chunk_size: at most this many samples per forward/backward, or ``None``.
            key: the key of a Monte-Carlo transform's draws (``sbfunc.random.key(seed)``),
                which requires it: the same key gives the same result, whatever
                ``chunk_size``. An exact transform ignores it.

        Returns:
            The transform's quantity for the ``S`` selected samples.
        """
        ...


class SquaredNorms(NamedTuple):
    """Per-sample squared gradient norms.

    Attributes:
        total: ``Tensor[S]``, the squared norm of each selected sample's whole gradient.
        per_param: ``{name: Tensor[S]}``, the squared norm of each parameter's gradient.

    Example:
        >>> from sbfunc.per_sample import SquaredNorms
        >>> SquaredNorms(torch.tensor([5.0]), {"w": torch.tensor([4.0]), "b": torch.tensor([1.0])})
        SquaredNorms(total=tensor([5.]), per_param={'w': tensor([4.]), 'b': tensor([1.])})

    References:
        Dangel et al. 2020, "BackPACK" (``BatchL2Grad``'s ``batch_l2``, per parameter).
    """

    total: torch.Tensor
    per_param: Params


def _stats(
    loss_fn: LossFn, wrt: Sequence[str] | None, stats: tuple[Stat, ...], per_sample: PerSample
) -> PerSampleTransform[dict[str, Params]]:
    check_loss_fn(loss_fn)
    names = check_wrt(wrt)
    check_per_sample(per_sample)

    def f(
        params: Params,
        buffers: Params,
        batch: Any,
        /,
        *,
        subsampling: Sequence[int] | torch.Tensor | None = None,
        chunk_size: int | None = None,
        key: Key | None = None,  # exact: nothing is drawn
    ) -> dict[str, Params]:
        return compute(
            loss_fn,
            params,
            buffers,
            batch,
            wrt=names,
            stats=stats,
            subsampling=subsampling,
            chunk_size=chunk_size,
            per_sample=per_sample,
        )

    return f


def batch_grad(
    loss_fn: LossFn, *, wrt: Sequence[str] | None = None, per_sample: PerSample = None
) -> PerSampleTransform[Params]:
    """Per-sample gradients: ``{name: Tensor[S, *shape]}``, row ``i`` the gradient of sample
    ``subsampling[i]``'s own loss.

    Linear and Conv weights are computed as ``sum_t g_t x_t^T`` from one forward and one
    backward (no ``vmap``); other parameters use ``vmap(grad)``.

    Args:
        loss_fn: per-sample loss function ``(params, buffers, batch) -> Tensor[N]`` whose
            samples do not interact: no train-mode BatchNorm with running statistics (without
            them, as after ``torch.func.replace_all_batch_norm_modules_``, each sample is
            normalized on its own, through ``vmap``).
        wrt: parameter names or module prefixes to differentiate (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, subsampling=None, chunk_size=None) -> dict``.

    Raises:
        TypeError: for a non-callable ``loss_fn``, a malformed ``wrt`` or ``per_sample``.
            Calls raise ``ValueError`` for ``params``/``buffers`` that do not match the
            module of a :class:`~sbfunc.module.ModuleLoss`, bad indices, unknown ``wrt`` names,
            train-mode BatchNorm or a loss that is not ``[N]``.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(8, 2, 2), torch.randint(0, 3, (8,)))
        >>> from sbfunc.per_sample import batch_grad
        >>> grads = batch_grad(loss_fn)(params, buffers, batch, subsampling=[0, 1, 5])
        >>> {k: tuple(v.shape) for k, v in grads.items()}
        {'1.weight': (3, 3, 4), '1.bias': (3, 3)}

    References:
        Dangel et al. 2020, "BackPACK: Packing more into backprop" (``BatchGrad``);
        Goodfellow 2015, "Efficient per-example gradient computations".
    """
    f = _stats(loss_fn, wrt, ("grad",), per_sample)
    return lambda params, buffers, batch, /, **kw: f(params, buffers, batch, **kw)["grad"]


def batch_l2_grad(
    loss_fn: LossFn, *, wrt: Sequence[str] | None = None, per_sample: PerSample = None
) -> PerSampleTransform[SquaredNorms]:
    """Per-sample squared gradient norms, per parameter and in total (:class:`SquaredNorms`).

    Linear and Conv weights use ``||x_i||^2 ||g_i||^2`` (2-D inputs) or the Gram form
    ``sum_{s,t} (x_s . x_t)(g_s . g_t)`` (sequence and unfolded conv inputs, when cheaper than
    the gradient) without materializing per-sample gradients; biases use the summed output
    gradient; other parameters ``vmap(grad)``.

    Args:
        loss_fn: per-sample loss function ``(params, buffers, batch) -> Tensor[N]`` whose
            samples do not interact (no train-mode BatchNorm).
        wrt: parameter names or module prefixes to differentiate (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, subsampling=None, chunk_size=None) -> SquaredNorms``
        (``total`` and ``per_param``, each ``[S]``).

    Raises:
        TypeError: for a non-callable ``loss_fn``, a malformed ``wrt`` or ``per_sample``.
            Calls raise
            ``ValueError`` as :func:`batch_grad`'s do.

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
        >>> from sbfunc.per_sample import batch_l2_grad
        >>> norms = batch_l2_grad(loss_fn)(params, buffers, batch)
        >>> norms.total.shape, sorted(norms.per_param)
        (torch.Size([8]), ['bias', 'weight'])
        >>> bool(torch.allclose(norms.total, sum(norms.per_param.values())))
        True

    References:
        Dangel et al. 2020, "BackPACK" (``BatchL2Grad``); Li et al. 2022, "Large language models
        can be strong differentially private learners" (ghost clipping).
    """
    f = _stats(loss_fn, wrt, ("sq_norm",), per_sample)

    def norms(params: Params, buffers: Params, batch: Any, /, **kw: Any) -> SquaredNorms:
        per_param = f(params, buffers, batch, **kw)["sq_norm"]
        return SquaredNorms(torch.stack(list(per_param.values())).sum(0), per_param)

    return norms


def sum_grad_squared(
    loss_fn: LossFn, *, wrt: Sequence[str] | None = None, per_sample: PerSample = None
) -> PerSampleTransform[Params]:
    """Elementwise sum of squared per-sample gradients ``sum_i g_i^2``, shaped like each param.

    For Linear layers on 2-D inputs it is ``(g^2)^T (x^2)``, never forming ``g_i``.

    Args:
        loss_fn: per-sample loss function ``(params, buffers, batch) -> Tensor[N]`` whose
            samples do not interact (no train-mode BatchNorm).
        wrt: parameter names or module prefixes to differentiate (default: all).
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, subsampling=None, chunk_size=None) -> dict`` of tensors
        shaped like the parameters; chunks are summed.

    Raises:
        TypeError: for a non-callable ``loss_fn``, a malformed ``wrt`` or ``per_sample``.
            Calls raise
            ``ValueError`` as :func:`batch_grad`'s do.

    Example:
        >>> model = torch.nn.Linear(4, 3)
        >>> loss_fn = sbfunc.per_sample_loss(model, torch.nn.functional.cross_entropy)
        >>> params, buffers = sbfunc.split_module(model)
        >>> batch = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
        >>> from sbfunc.per_sample import batch_grad, sum_grad_squared
        >>> sgs = sum_grad_squared(loss_fn)(params, buffers, batch)
        >>> g = batch_grad(loss_fn)(params, buffers, batch)
        >>> bool(torch.allclose(sgs["weight"], g["weight"].square().sum(0)))
        True

    References:
        Dangel et al. 2020, "BackPACK" (``SumGradSquared``).
    """
    f = _stats(loss_fn, wrt, ("sum_sq",), per_sample)
    return lambda params, buffers, batch, /, **kw: f(params, buffers, batch, **kw)["sum_sq"]


def variance(
    loss_fn: LossFn, *, wrt: Sequence[str] | None = None, per_sample: PerSample = None
) -> PerSampleTransform[Params]:
    """Elementwise variance of the per-sample gradients over the ``S`` selected samples.

    ``mean_i g_i^2 - (mean_i g_i)^2`` (the population variance, BackPACK's ``Variance``
    definition): with a mean-reduced loss BackPACK returns this divided by ``N^2``.

    Args:
        loss_fn: the per-sample loss (as for :func:`batch_grad`).
        wrt: names or module prefixes of the parameters whose gradient variance is wanted.
        per_sample: which leaves of the batch are per-sample
            (:data:`sbfunc.types.PerSample`; default: inferred).

    Returns:
        ``f(params, buffers, batch, *, subsampling=None, chunk_size=None)`` returning the
        variances, one tensor per parameter with its shape (``S`` must be at least 1).

    Raises:
        TypeError: as :func:`batch_grad` (the same validation, the same call-time errors).

    Example:
        >>> from sbfunc.per_sample import variance
        >>> def loss_fn(params, buffers, batch):  # any pure per-sample loss works
        ...     return (batch["x"] @ params["w"] - batch["y"]).square()
        >>> batch = {"x": torch.tensor([[1.0], [2.0], [3.0]]), "y": torch.zeros(3)}
        >>> variance(loss_fn)({"w": torch.ones(1)}, {}, batch, subsampling=[0, 2])
        {'w': tensor([64.])}

    References:
        Dangel et al. 2020, "BackPACK" (``Variance``).
    """
    f = _stats(loss_fn, wrt, ("sum", "sum_sq"), per_sample)

    def var(params: Params, buffers: Params, batch: Any, /, **kw: Any) -> Params:
        out = f(params, buffers, batch, **kw)
        sub = kw.get("subsampling")
        n = (
            batch_size(batch, per_sample=per_sample) if sub is None else len(sub)
        )  # validated by ``f``
        return {k: out["sum_sq"][k] / n - (v / n).square() for k, v in out["sum"].items()}

    return var
