"""Hypothesis strategies and a toy algorithm, for property-testing passes and algorithms.

Needs ``hypothesis`` (the ``test`` extra). The strategies draw events, lists of toy algorithms
with random flags and colliding names, pytree batches and states whose params and batches fit
a linear classifier (:func:`linear_loss`); a :class:`Toy` logs its ``tag`` in its own state
when applied, and :func:`applied` reads the order of applications from the engine's traces.

Example:
    Property-test your own pass: it must return a permutation of its input on every event.

    >>> from hypothesis import given, settings
    >>> from sbfunc.testing import algorithm_lists, events
    >>> def interpolation_last(algorithms, event):
    ...     return sbfunc.engine.sort_to_back(algorithms, lambda a: a.interpolate_loss)
    >>> @settings(max_examples=25, derandomize=True, database=None)
    ... @given(algorithm_lists(), events())
    ... def test_permutation(algs, event):
    ...     out = interpolation_last(algs, event)
    ...     assert sorted(map(id, out)) == sorted(map(id, algs))
    >>> test_permutation()

References:
    Hypothesis (MacIver et al. 2019); optax's registry-wide transform tests.
"""

try:
    import hypothesis  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sbfunc.testing needs hypothesis: pip install hypothesis (or pip install 'sbfunc[test]')"
    ) from err

from sbfunc._namespace import api_dir
from sbfunc.testing._strategies import (
    CLASSES,
    FEATURES,
    algorithm_lists,
    algorithms,
    events,
    linear_loss,
    pytree_batches,
    states,
    train_states,
)
from sbfunc.testing._toy import Toy, applied

__all__ = [
    "CLASSES",
    "FEATURES",
    "Toy",
    "algorithm_lists",
    "algorithms",
    "applied",
    "events",
    "linear_loss",
    "pytree_batches",
    "states",
    "train_states",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
