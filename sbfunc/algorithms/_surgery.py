"""Model surgery as pure ``module -> module`` callables: copy, then swap submodules.

Composer changes a model in place on ``Event.INIT``. In sbfunc the training step's loss
function closes over the module and the step works on the dicts of
:func:`sbfunc.split_module`, so surgery happens once, before both: ``model = surgery(model)``,
then ``split_module(model)`` and ``per_sample_loss(model, ...)``. A surgery is a
:class:`Surgery`, built once from its settings and called on the model, the one spelling; every
surgery deep-copies its input and never changes it.
"""

from __future__ import annotations

import copy
from abc import abstractmethod
from collections.abc import Callable, Sequence

from torch import nn

from sbfunc._frozen import Frozen
from sbfunc._namespace import deprecated

__all__ = ["ModuleSelector", "Surgery", "matching_modules", "replace_modules", "selector"]

ModuleSelector = type | tuple[type, ...] | Sequence[str] | Callable[[str, nn.Module], bool]
"""Which submodules a surgery targets: a class (or tuple of classes), a list of qualified
names (as ``named_modules`` spells them) or a predicate ``(name, module) -> bool``."""

Replacement = Callable[[str, nn.Module], nn.Module | None]
"""What replaces a targeted submodule: ``(name, module) -> new module`` (``None``: keep it);
Composer's ``ReplacementFunction``."""


def selector(target: ModuleSelector, arg: str = "target") -> Callable[[str, nn.Module], bool]:
    """The predicate ``(name, module) -> bool`` that ``target`` describes.

    Raises:
        TypeError: if ``target`` is none of the forms of :data:`ModuleSelector`.

    Example:
        >>> selector(torch.nn.Linear)("fc", torch.nn.Linear(1, 1))
        True
        >>> selector(["0.fc"])("1.fc", torch.nn.Linear(1, 1))
        False
    """
    if isinstance(target, type) or (
        isinstance(target, tuple) and target and all(isinstance(c, type) for c in target)
    ):
        classes = target
        return lambda name, module: isinstance(module, classes)
    if isinstance(target, Sequence) and not isinstance(target, str):
        names = frozenset(target)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"{arg} names must be str, got {sorted(map(repr, names))}")
        return lambda name, module: name in names
    if callable(target):
        return target
    raise TypeError(
        f"{arg} must be a module class, a tuple of classes, a list of qualified module names "
        f"or a predicate (name, module) -> bool, got {target!r}"
    )


def matching_modules(module: nn.Module, select: Callable[[str, nn.Module], bool]) -> list[str]:
    """Qualified names of the submodules ``select`` picks, in the order
    :func:`replace_modules` visits them (depth first; a picked module's children are skipped,
    and a module reached under several names is listed under the first).

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(),
        ...                           torch.nn.Linear(2, 1))
        >>> matching_modules(net, lambda name, m: isinstance(m, torch.nn.Linear))
        ['0', '2']
    """
    found: list[str] = []
    seen: set[int] = set()

    def visit(name: str, m: nn.Module) -> None:
        if id(m) in seen:  # shared: listed (and replaced) once, under its first name
            return
        seen.add(id(m))
        if select(name, m):
            found.append(name)
            return
        for child_name, child in m.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)

    visit("", module)
    return found


def replace_modules(module: nn.Module, policy: Replacement) -> nn.Module:
    """A deep copy of ``module`` in which ``policy`` may replace any submodule.

    ``policy(name, submodule)`` is called depth first on the copy (the root has the name
    ``""``) and returns the replacement, or ``None`` to keep the submodule and visit its
    children. A replacement's own children are not visited. A submodule reached under several
    names (shared) is replaced once, by the same new module everywhere.

    Args:
        module: the model (never changed).
        policy: ``(qualified name, submodule of the copy) -> new module or None``.

    Returns:
        The new model.

    Example:
        >>> from sbfunc.algorithms import replace_modules
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> new = replace_modules(
        ...     net, lambda name, m: torch.nn.GELU() if isinstance(m, torch.nn.ReLU) else None)
        >>> type(new[1]).__name__, type(net[1]).__name__
        ('GELU', 'ReLU')

    References:
        MosaicML Composer ``composer.utils.module_surgery.replace_module_classes``.
    """
    root = copy.deepcopy(module)
    done: dict[int, nn.Module] = {}

    def visit(name: str, m: nn.Module) -> nn.Module:
        if id(m) in done:
            return done[id(m)]
        new = policy(name, m)
        if new is None:
            for child_name, child in list(m.named_children()):
                replaced = visit(f"{name}.{child_name}" if name else child_name, child)
                if replaced is not child:
                    setattr(m, child_name, replaced)
            new = m
        done[id(m)] = new
        return new

    return visit("", root)


class Surgery(Frozen):
    """A Composer model-surgery algorithm as a pure ``module -> module`` callable: the one
    spelling of a surgery is ``model = surgery(model)``.

    Call it on the model before :func:`sbfunc.split_module` and
    :func:`sbfunc.per_sample_loss`. A surgery that also acts during training (ALiBi's batch
    reshaping, stochastic depth's warm-up, channels-last on ``INIT``) is an
    :class:`sbfunc.Algorithm` as well, and so is BlurPool, which Composer lists among a
    trainer's algorithms (it matches no event); the others are not, so listing one among a
    step's algorithms fails loudly instead of doing nothing. Like an algorithm, a surgery is
    frozen once constructed.

    Example:
        >>> from sbfunc.algorithms import GhostBatchNorm, Surgery
        >>> surgery = GhostBatchNorm(ghost_batch_size=4)
        >>> isinstance(surgery, Surgery), type(surgery(torch.nn.BatchNorm1d(3))).__name__
        (True, 'GhostBatchNorm1d')

    References:
        MosaicML Composer ``composer.utils.module_surgery``; Equinox (a model transformed by
        pure functions that return a new model).
    """

    _frozen_kind = "Surgery"

    @abstractmethod
    def __call__(self, module: nn.Module) -> nn.Module:
        """The changed copy of ``module`` (``module`` itself is never changed)."""

    def surgery(self, module: nn.Module) -> nn.Module:
        """1.1's spelling of ``self(module)`` (``BlurPool(...).surgery(model)``): deprecated."""
        name = type(self).__name__
        deprecated(f"{name}.surgery(model)", f"{name}(...)(model)", "1.2")
        return self(module)
