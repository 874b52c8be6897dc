"""Explicit, splittable, counter-based random keys (JAX-style Threefry-2x32) for PyTorch.

All randomness in sbfunc enters as a *key*: an ``int64`` tensor of shape ``(2,)`` holding two
32-bit words (JAX's raw ``uint32[2]`` key data). Keys are pure values: the same key always gives
the same noise, and a key is an ordinary tensor, so it checkpoints with
``torch.save(..., weights_only=True)``, travels inside any pytree state and can be a graph input
of a compiled step.

Why counter-based. Noise is not read from a stateful generator: element ``i`` of a draw is the
Threefry-2x32 block cipher (Salmon et al. 2011) applied to the counter ``i`` under the key, in
plain integer tensor ops. Hence

- the same key gives the same numbers on every device (CPU, CUDA, ...) and in eager and compiled
  code, unlike ``torch.Generator`` streams, which differ per device type;
- everything traces under ``torch.compile(fullgraph=True)`` (no generator object, no host
  reads) and under ``torch.func`` transforms;
- the numbers are bit-identical to ``jax.random`` (default ``jax_threefry_partitionable``) for
  :func:`key`, :func:`split`, :func:`fold_in`, :func:`bits`, :func:`uniform` (also
  :func:`randint`, :func:`permutation`, :func:`bernoulli`, :func:`gumbel`), so a JAX
  reference implementation can be matched number for number.

Deriving streams. Never reuse a key for two purposes: :func:`split` makes ``num`` independent
children (child ``i`` encrypts the counter ``(0, i)``), :func:`fold_in` mixes an integer into a
key (a step, a rank, a sample id; a 0-d tensor works too, inside a compiled step). Key
derivation on a CPU key in eager code, and draws of up to 4096 elements on the CPU, run the
cipher on packed Python ints and dispatch no tensor op (microseconds; see
``docs/concepts/randomness.md``); elsewhere it is ~150 elementwise tensor ops, fused into one
kernel by ``torch.compile``.
:func:`keyed` runs a model's own dropout (and ``torch.rand``-style calls) from a key.

Example:
    >>> key = sbfunc.random.key(0)
    >>> k_noise, k_drop = sbfunc.random.split(key)
    >>> u = sbfunc.random.uniform(k_noise, (3,))
    >>> u
    tensor([0.8423, 0.1824, 0.2272])
    >>> bool(torch.equal(u, sbfunc.random.uniform(k_noise, (3,))))
    True
    >>> step_key = sbfunc.random.fold_in(key, 7)
    >>> bool(torch.equal(step_key, sbfunc.random.fold_in(key, torch.tensor(7))))
    True
"""

from sbfunc._namespace import api_dir
from sbfunc.random._discrete import categorical, permutation, randint
from sbfunc.random._gamma import beta, gamma
from sbfunc.random._keyed_mode import KeyedMode, keyed
from sbfunc.random._keys import Key, check_key, fold_in, is_key, key, split
from sbfunc.random._sampling import bernoulli, bits, gumbel, gumbel_from_uniform, normal, uniform

__all__ = [
    "Key",
    "KeyedMode",
    "bernoulli",
    "beta",
    "bits",
    "categorical",
    "check_key",
    "fold_in",
    "gamma",
    "gumbel",
    "gumbel_from_uniform",
    "is_key",
    "key",
    "keyed",
    "normal",
    "permutation",
    "randint",
    "split",
    "uniform",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
