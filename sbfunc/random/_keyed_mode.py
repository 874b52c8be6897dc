"""``keyed(k)``: run a model's own random ops (dropout, ``torch.rand``, ...) from a key."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from sbfunc.random import _keyed_ops as ops
from sbfunc.random._keys import Key, check_key, fold_in

__all__ = ["KeyedMode", "keyed"]

_KEYED: dict[Callable[..., Any], Callable[..., Any]] = {
    **ops.FUNCTIONAL_DROPOUT,
    **ops.VF_DROPOUT,
    F.scaled_dot_product_attention: ops.sdpa,
    torch.rand: ops.RAND,
    torch.randn: ops.RANDN,
    torch.rand_like: ops.RAND_LIKE,
    torch.randn_like: ops.RANDN_LIKE,
    torch.bernoulli: ops.take_bernoulli,
    torch.Tensor.bernoulli: ops.take_bernoulli,
    torch.Tensor.bernoulli_: ops.bernoulli_,
}


def _unkeyed() -> dict[Callable[..., Any], str]:
    """The random ops that keyed() refuses, by object, with their public names."""
    names = {
        torch: (
            "randint randint_like randperm multinomial normal poisson binomial rrelu rrelu_ "
            "native_dropout _fused_dropout _standard_gamma _sample_dirichlet"
        ),
        torch.Tensor: (
            "random_ uniform_ normal_ exponential_ geometric_ cauchy_ log_normal_ multinomial"
        ),
        F: "rrelu rrelu_ gumbel_softmax",
    }
    prefix = {torch: "torch.", torch.Tensor: "torch.Tensor.", F: "torch.nn.functional."}
    return {
        getattr(owner, name): prefix[owner] + name
        for owner, spelled in names.items()
        for name in spelled.split()
        if hasattr(owner, name)
    }


_UNKEYED = _unkeyed()
_PLAIN: set[Callable[..., Any]] = set()
"""The torch functions seen to draw nothing and to have no Python body: the mode passes them
straight on (a set lookup, where deciding again costs three lookups and a type check per op)."""
_RRELU = {torch.rrelu, torch.rrelu_, F.rrelu, F.rrelu_}
# torch >= 2.13 can run a Python-level torch function's body with the mode still active (so
# that MultiheadAttention's inner dropout is keyed too); older torch, and Dynamo, cannot.
_REDISPATCH: Callable[..., Any] | None = getattr(torch.overrides, "redispatch_function", None)


def _deterministic(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """Whether this call of a random op draws nothing (only RReLU in eval mode does)."""
    if func in _RRELU:
        training = kwargs.get("training", args[3] if len(args) > 3 else False)
        return not training
    return False


def _attention_drops(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an ``F.multi_head_attention_forward`` call applies dropout."""
    dropout_p = kwargs.get("dropout_p", args[10] if len(args) > 10 else 0.0)
    training = kwargs.get("training", args[13] if len(args) > 13 else True)
    return bool(training) and dropout_p > 0


def _has_body(func: Callable[..., Any]) -> bool:
    """Whether ``func`` is a Python-level torch function whose body may call random ops (e.g.
    ``F.multi_head_attention_forward``). ``Tensor``'s own Python methods are excluded: their
    body calls the C method, which dispatches as the Python method again (endless re-entry)."""
    return (
        isinstance(func, types.FunctionType)
        and getattr(torch.Tensor, func.__name__, None) is not func
    )


class KeyedMode(TorchFunctionMode):
    """The mode returned by :func:`keyed`: it counts its keyed calls from 0 in each ``with``.

    Args:
        k: the key the calls are derived from (``fold_in(k, i)`` for the ``i``-th call).

    Example:
        >>> with sbfunc.random.keyed(sbfunc.random.key(0)) as mode:
        ...     _ = torch.nn.functional.dropout(torch.ones(3), 0.5)
        >>> mode.calls
        1
    """

    def __init__(self, k: Key) -> None:
        super().__init__()
        self.key = k
        self.calls = 0
        self._depth = 0

    def __enter__(self) -> KeyedMode:
        if self._depth == 0:
            self.calls = 0
        self._depth += 1
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        super().__exit__(*exc)

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types_: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _PLAIN:  # most calls: an op that draws nothing and has no body to enter
            return func(*args, **kwargs)
        own_generator = kwargs.get("generator") is not None
        impl = _KEYED.get(func)
        if impl is not None and not own_generator:
            k = fold_in(self.key, self.calls)
            self.calls += 1
            return impl(k, *args, **kwargs)
        name = _UNKEYED.get(func)
        if name is not None and not own_generator and not _deterministic(func, args, kwargs):
            raise RuntimeError(
                f"{name} is random and sbfunc cannot key it: under sbfunc.random.keyed(key) only "
                "dropout, scaled_dot_product_attention's dropout, rand(_like), randn(_like) and "
                "bernoulli draw from the key. Draw this noise with sbfunc.random from a key, or "
                "pass it an explicit generator=."
            )
        if _has_body(func):
            if _REDISPATCH is not None and not torch.compiler.is_compiling():
                with self:
                    return _REDISPATCH(func, types_, args, kwargs)
            if func is F.multi_head_attention_forward and _attention_drops(args, kwargs):
                raise RuntimeError(
                    "MultiheadAttention's dropout is out of sbfunc.random.keyed's reach here "
                    "(under torch.compile, or with torch < 2.13, the mode cannot re-enter a "
                    "Python-level torch function); run it eagerly on torch >= 2.13, or set its "
                    "dropout to 0 and add an nn.Dropout."
                )
        elif impl is None and name is None:
            _PLAIN.add(func)
        return func(*args, **kwargs)


def keyed(k: Key) -> KeyedMode:
    """A context manager under which a model's random ops draw from ``k``, not torch's RNG.

    Under ``with keyed(k):`` the dropout family (``F.dropout``, ``dropout1d/2d/3d``,
    ``alpha_dropout``, ``feature_alpha_dropout``, their ``torch.*`` spellings and so every
    ``nn.*Dropout*`` module), ``F.scaled_dot_product_attention`` with ``dropout_p > 0`` (run
    in its math formulation with a keyed dropout of the attention weights), ``torch.rand``,
    ``torch.randn``, ``torch.rand_like``, ``torch.randn_like`` and ``bernoulli``
    (``torch.bernoulli``, ``Tensor.bernoulli(_)``) keep torch's semantics but take their noise
    from ``fold_in(k, i)``, where ``i`` counts these calls from 0 in each ``with`` block (a
    call with ``p == 0`` or ``training=False`` counts too, so one layer's settings never shift
    another layer's mask). The ``i``-th call's dropout mask is
    ``bernoulli(fold_in(k, i), 1 - p, shape)`` (``shape`` is ``(N, C, 1, ...)`` for feature
    dropout). Other random ops (``randint``, ``multinomial``, ``normal_``, ``randperm``, ...)
    raise a ``RuntimeError``; a call that passes its own ``generator=`` is left alone, and so
    are all non-random ops.

    In eager code (torch >= 2.13) the random ops inside Python-level torch functions are
    reached too (``MultiheadAttention``'s attention dropout is keyed, ``nn.init`` raises).

    The mode works under ``torch.func`` transforms (``grad``, ``vmap`` over keys) and inside
    ``torch.compile(fullgraph=True)``; enter it inside the compiled function (the count is a
    Python int, so a mode entered outside would recompile at every call). Two Dynamo limits
    (torch 2.13): it does not route ``rand_like``, ``randn_like``, ``randint_like`` and
    tensor-``normal`` through modes, so compiled, these draw from torch's generator (spell
    them ``torch.rand(x.shape, ...)``); and it cannot re-enter a mode inside a Python-level
    torch function, so compiled, ``MultiheadAttention`` with dropout raises. Torch 2.11's
    Dynamo also leaves a compiled ``torch.rand`` and ``torch.randn`` to torch's generator (the
    dropout family and ``scaled_dot_product_attention`` are keyed there too). ``k``'s
    ``fold_in`` children are also ``split(k)``'s children, so give the mode a key of its own.

    Args:
        k: the key (see :func:`key`).

    Returns:
        A :class:`torch.overrides.TorchFunctionMode` to use in a ``with`` statement.

    Raises:
        TypeError: if ``k`` is not a key.

    Example:
        >>> drop = torch.nn.Dropout(0.5)
        >>> x = torch.ones(6)
        >>> with sbfunc.random.keyed(sbfunc.random.key(0)):
        ...     y = drop(x)
        >>> y
        tensor([0., 2., 2., 2., 2., 0.])
        >>> keep = sbfunc.random.bernoulli(sbfunc.random.fold_in(sbfunc.random.key(0), 0), 0.5, 6)
        >>> bool(torch.equal(y, x * keep / 0.5))
        True

    References:
        PyTorch ``torch.overrides.TorchFunctionMode``; JAX/Flax's ``rngs={"dropout": key}``
        (``flax.linen.Dropout`` draws from an explicit key); Srivastava et al. 2014, "Dropout";
        Klambauer et al. 2017, "Self-Normalizing Neural Networks" (alpha dropout).
    """
    return KeyedMode(check_key(k, "k"))
