"""Hypothesis strategies and a toy algorithm, for property-testing passes and algorithms.

Needs ``hypothesis`` (the ``test`` extra). The strategies draw events, lists of toy algorithms
with random flags and colliding names, pytree batches and train states; a :class:`Toy` logs
its ``tag`` in ``state.algorithm_state["log"]`` when applied, so the log is the order of
application.

Example:
    Property-test your own pass: it must return a permutation of its input on every event.

    >>> from hypothesis import given, settings
    >>> from sbfunc.testing import algorithm_lists, events
    >>> def interpolation_last(algorithms, event):
    ...     return sbfunc.passes.sort_to_back(algorithms, lambda a: a.interpolate_loss)
    >>> @settings(max_examples=25, derandomize=True, database=None)
    ... @given(algorithm_lists(), events())
    ... def test_permutation(algs, event):
    ...     out = interpolation_last(algs, event)
    ...     assert sorted(map(id, out)) == sorted(map(id, algs))
    >>> test_permutation()

References:
    Hypothesis (MacIver et al. 2019); optax's registry-wide transform tests.
"""

import sbfunc.passes  # noqa: F401  (the example above uses sbfunc.passes)
from sbfunc.testing.strategies import (
    algorithm_lists,
    algorithms,
    events,
    pytree_batches,
    states,
)
from sbfunc.testing.toy import LOG, Toy

__all__ = ["LOG", "Toy", "algorithm_lists", "algorithms", "events", "pytree_batches", "states"]
