"""The ``Algorithm`` base class: a pure ``match``/``apply`` pair with declared flags."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, TypeVar

from sbfunc._frozen import Frozen, replaced
from sbfunc.engine._events import Event
from sbfunc.engine._state import Context

__all__ = ["FLAGS", "Algorithm", "ApplyResult"]

ApplyResult = Context | tuple[Context, int | None]
"""What ``apply`` returns: a new context, or ``(ctx, exit_code)`` to record a code in the trace."""

FLAGS: tuple[str, ...] = (
    "backwards_create_graph",
    "find_unused_parameters",
    "interpolate_loss",
    "selects_samples",
    "selects_tokens",
    "fuses_layernorm",
    "changes_sequence_length",
)
"""The boolean class attributes every algorithm declares (combinators OR them together)."""

_A = TypeVar("_A", bound="Algorithm")


class Algorithm(Frozen):
    """A training trick as pure functions of an event and a :class:`Context`.

    * ``init(key)`` returns the algorithm's persistent state (``None`` for none); the step
      stores it in ``TrainState.algorithm_state`` at the algorithm's position in the list.
    * ``match(event, ctx)`` says whether to run. The engine calls it on the host, before the
      step's tensor work, so decide from ``ctx.time``, the event and the algorithm's own
      configuration, never from tensor values (a compiled step would have to sync and
      recompile). Any truthy value means yes; combinators return their parts' decisions, which
      ``apply`` reads back as ``ctx.matched``. The default ``match`` runs on every event of
      ``events``: an algorithm that declares its events needs no ``match`` of its own.
    * ``apply(event, ctx)`` returns a **new** :class:`Context` (never mutating its input) or,
      to report an exit code, ``(new_ctx, exit_code)``. It sees its own persistent state as
      ``ctx.own``, its per-batch scratch as ``ctx.scratch`` and its own key for this step and
      event as ``ctx.key``; it changes them with ``ctx.replace(...)``. Inside a step
      ``ctx.time`` holds 0-d tensors (read it there, never a Python number).

    Class attributes (declared, never duck-typed): ``backwards_create_graph``,
    ``find_unused_parameters``, ``interpolate_loss`` (as in Composer), ``selects_samples``
    (the algorithm prunes the batch, like Selective Backprop: the default passes run it first),
    ``selects_tokens`` (it ranks the batch's tokens on ``AFTER_LOSS``, like token selection:
    a microbatched step fires it once, on the whole batch's token losses),
    ``fuses_layernorm`` (the passes run it last) and ``changes_sequence_length`` (it cuts the
    batch's sequences: the passes run it before everything, sample selection included).
    ``uses_key`` (default ``True``) says
    whether ``apply`` draws randomness: a deterministic algorithm sets it to ``False`` and the
    engine skips deriving its key (``ctx.key`` is then ``None``), which saves a Threefry
    block per application in eager steps. ``name`` is the class name unless the
    class body or the constructor sets one (:meth:`renamed` gives a copy with another); it
    labels traces and, with the algorithm's rank among same-named algorithms, derives its
    random stream (so adding or moving another algorithm never changes its draws).
    Combinators list what they wrap in ``parts``.

    An algorithm is **frozen** once its constructor returns, like an equinox module: setting
    or deleting an attribute raises ``AttributeError``, and ``for_step``, the combinators and
    :meth:`renamed` build new algorithms instead (see ``docs/concepts/transforms.md``).

    Example:
        >>> from sbfunc.engine import Algorithm, Event
        >>> class CountSteps(Algorithm):
        ...     def init(self, key):
        ...         return 0
        ...     events = frozenset({Event.BATCH_END})  # match: on these events
        ...     def apply(self, event, ctx):
        ...         return ctx.replace(own=ctx.own + 1)
        >>> alg = CountSteps()
        >>> ctx = sbfunc.Context(sbfunc.random.key(0), own=alg.init(sbfunc.random.key(0)))
        >>> alg.match(Event.BATCH_END, ctx), alg.match(Event.EPOCH_END, ctx)
        (True, False)
        >>> alg.apply(Event.BATCH_END, ctx).own
        1
        >>> alg.renamed("counter")
        CountSteps(name='counter')
        >>> alg.name = "counter"
        Traceback (most recent call last):
        ...
        AttributeError: Algorithm 'CountSteps' is frozen: ...

    References:
        MosaicML Composer ``composer.core.Algorithm``; optax ``GradientTransformation``.
    """

    backwards_create_graph: bool = False
    find_unused_parameters: bool = False
    interpolate_loss: bool = False
    selects_samples: bool = False
    selects_tokens: bool = False
    fuses_layernorm: bool = False
    changes_sequence_length: bool = False
    uses_key: bool = True
    """Whether ``apply`` reads ``ctx.key`` (``False``: the engine passes ``None``)."""
    uses_elapsed: bool = False
    """Whether ``match`` decides from ``time.elapsed`` (the fraction of training done): a step
    with such an algorithm refuses to run until the run's length is known."""
    events: frozenset[Event] | None = None
    """The events ``match`` can accept (``None``: any). The engine calls ``match`` only on
    these, so declaring them keeps a step's host work independent of the number of events;
    the default ``match`` accepts exactly these (a subclass sets ``events``, ``match`` or
    both)."""
    parts: tuple[Algorithm, ...] = ()
    """Sub-algorithms (set by combinators)."""
    name: str = "Algorithm"
    """The name in traces; with the rank among same-named algorithms, the random stream."""
    _frozen_kind = "Algorithm"
    _frozen_how = "its constructor, or alg.renamed(...) for another name"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__
        if cls.events is not None and getattr(cls.match, "__isabstractmethod__", False):
            cls.match = _match_declared_events  # type: ignore[method-assign]

    def init(self, key: Any) -> Any:
        """The algorithm's own initial state, or ``None`` for none (the default).

        Args:
            key: an ``sbfunc.random`` key reserved for this algorithm's initialisation.

        Returns:
            Any pytree with a fixed structure (it is checkpointed with the train state).

        Example:
            >>> sbfunc.algorithms.LabelSmoothing(num_classes=3).init(sbfunc.random.key(0)) is None
            True
        """
        return None

    @abstractmethod
    def match(self, event: Event, ctx: Context) -> Any:
        """Whether to run on ``event`` (truthy: yes); decided on the host from ``ctx.time``.

        A subclass that declares ``events`` and no ``match`` gets ``event in self.events``;
        one that declares neither stays abstract (it cannot be built)."""

    @abstractmethod
    def apply(self, event: Event, ctx: Context) -> ApplyResult:
        """Return the new context, or ``(new_ctx, exit_code)``; never mutate ``ctx``."""

    def for_step(self, *, loss_fn: Any, per_sample: Any) -> Algorithm:
        """This algorithm set up for a training step with ``loss_fn`` and ``per_sample``.

        :func:`sbfunc.make_train_step` calls it on every algorithm when it builds the step, so
        the loss and the per-sample spec are given once, to the step: an algorithm that needs
        them (Selective Backprop scores with the step's loss) returns a copy that uses them.
        The default returns ``self``; combinators bind their parts.

        Args:
            loss_fn: the step's per-sample training loss.
            per_sample: the step's per-sample spec (:data:`sbfunc.types.PerSample`).

        Example:
            >>> alg = sbfunc.algorithms.LabelSmoothing(num_classes=3)
            >>> alg.for_step(loss_fn=None, per_sample=None) is alg
            True
        """
        return self

    def renamed(self: _A, name: str) -> _A:
        """A copy of this algorithm named ``name`` (in traces, and for its random stream).

        Args:
            name: the new name, a non-empty str.

        Raises:
            TypeError: if ``name`` is not a non-empty str.

        Example:
            >>> cutout = sbfunc.algorithms.CutOut(length=0.5)
            >>> cutout.renamed("second_cutout").name, cutout.name
            ('second_cutout', 'CutOut')
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        return replaced(self, name=name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _match_declared_events(self: Algorithm, event: Event, ctx: Context) -> bool:
    """The default ``match`` of an algorithm that declares ``events``: run on every one."""
    assert self.events is not None  # set only on classes that declare events
    return event in self.events
