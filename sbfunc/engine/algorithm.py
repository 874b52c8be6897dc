"""The ``Algorithm`` base class: a pure ``match``/``apply`` pair with declared flags."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from sbfunc.engine.events import Event
from sbfunc.engine.state import State

__all__ = ["FLAGS", "Algorithm", "ApplyResult"]

ApplyResult = State | tuple[State, int | None]
"""What ``apply`` returns: a new state, or ``(state, exit_code)`` to record a code in the trace."""

FLAGS: tuple[str, ...] = (
    "backwards_create_graph",
    "find_unused_parameters",
    "interpolate_loss",
    "selects_samples",
    "fuses_layernorm",
)
"""The boolean class attributes every algorithm declares (combinators OR them together)."""


class Algorithm(ABC):
    """A training trick as two pure functions of an event and a :class:`State`.

    ``match(event, state)`` says whether to run; ``apply(event, state)`` returns a **new**
    state (never mutating its input) or, to report an exit code, the pair
    ``(new_state, exit_code)``; the engine stores the code in the :class:`Trace`. An algorithm
    with state of its own overrides ``init(key)``; its state lives in
    ``state.algorithm_state[self.name]``.

    Class attributes (declared, never duck-typed): ``backwards_create_graph``,
    ``find_unused_parameters``, ``interpolate_loss`` (as in Composer), ``selects_samples``
    (the algorithm prunes the batch, like Selective Backprop: the default passes run it first)
    and ``fuses_layernorm`` (the passes run it last). ``name`` is the class name unless the
    class body sets one; assign ``self.name`` to override it per instance (a plain attribute:
    the engine reads it on every event). Combinators list what they wrap in ``parts``.

    Example:
        >>> from sbfunc.engine import Algorithm, Event, init_state
        >>> class CountSteps(Algorithm):
        ...     def init(self, key):
        ...         return 0
        ...     def match(self, event, state):
        ...         return event == Event.BATCH_END
        ...     def apply(self, event, state):
        ...         n = state.algorithm_state[self.name] + 1
        ...         return state.replace(algorithm_state={**state.algorithm_state, self.name: n})
        >>> alg = CountSteps()
        >>> state = init_state({}, {}, key=sbfunc.random.key(0), algorithms=[alg])
        >>> alg.apply(Event.BATCH_END, state).algorithm_state
        {'CountSteps': 1}
        >>> alg.name = "counter"; alg
        CountSteps(name='counter')

    References:
        MosaicML Composer ``composer.core.Algorithm``; optax ``GradientTransformation``.
    """

    backwards_create_graph: bool = False
    find_unused_parameters: bool = False
    interpolate_loss: bool = False
    selects_samples: bool = False
    fuses_layernorm: bool = False
    parts: tuple[Algorithm, ...] = ()
    """Sub-algorithms (set by combinators); ``init_state`` initialises their state too."""
    name: str = "Algorithm"
    """The name in traces and in ``state.algorithm_state``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    def init(self, key: Any) -> Any:
        """The algorithm's own initial state, or ``None`` for none (the default).

        Args:
            key: an ``sbfunc.random`` key reserved for this algorithm.

        Returns:
            Any pytree, stored in ``state.algorithm_state[self.name]`` by ``init_state``.

        Example:
            >>> from sbfunc.testing import Toy
            >>> Toy().init(sbfunc.random.key(0)) is None
            True
        """
        return None

    @abstractmethod
    def match(self, event: Event, state: State) -> bool:
        """Whether to run on ``event`` given ``state`` (called once per event by the engine)."""

    @abstractmethod
    def apply(self, event: Event, state: State) -> ApplyResult:
        """Return the new state, or ``(new_state, exit_code)``; never mutate ``state``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
