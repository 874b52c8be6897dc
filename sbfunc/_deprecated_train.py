"""0.3's ``train=`` spelling of a per-sample loss's :data:`~sbfunc.module_io.Mode` (until 1.1).

``per_sample_loss(..., train=True/False/None/"auto")``, ``ModuleLoss.train`` and
``ModuleLoss.with_train`` are deprecated aliases of ``mode="train"/"eval"/"module"/"auto"``,
``ModuleLoss.mode`` and ``ModuleLoss.with_mode``; this module maps one spelling to the other.
"""

from __future__ import annotations

import enum
import warnings
from typing import Literal, cast

from sbfunc.module_io import Mode

__all__: list[str] = []

LegacyTrain = bool | None | Literal["auto"]
"""0.3's ``train=`` value: ``True``, ``False``, ``None`` or ``"auto"``."""

_MODE_OF_TRAIN: dict[LegacyTrain, Mode] = {
    True: "train",
    False: "eval",
    None: "module",
    "auto": "auto",
}
_TRAIN_OF_MODE = {mode: train for train, mode in _MODE_OF_TRAIN.items()}


class NotGiven(enum.Enum):
    """The default of a deprecated keyword: not given."""

    NOT_GIVEN = enum.auto()


NOT_GIVEN = NotGiven.NOT_GIVEN


def mode_of_train(train: object) -> Mode:
    """The :data:`~sbfunc.module_io.Mode` of a 0.3 ``train=`` value.

    Raises:
        TypeError: if ``train`` is not ``True``, ``False``, ``None`` or ``"auto"``.

    Example:
        >>> from sbfunc._deprecated_train import mode_of_train
        >>> mode_of_train(True), mode_of_train(False), mode_of_train(None), mode_of_train("auto")
        ('train', 'eval', 'module', 'auto')
    """
    if not (
        train is None or isinstance(train, bool) or (isinstance(train, str) and train == "auto")
    ):
        raise TypeError(f"train must be True, False, None or 'auto', got {train!r}")
    return _MODE_OF_TRAIN[cast(LegacyTrain, train)]


def train_of_mode(mode: Mode) -> LegacyTrain:
    """The 0.3 ``train=`` value of a mode (the inverse of :func:`mode_of_train`)."""
    return _TRAIN_OF_MODE[mode]


def renamed_train(owner: str, mode: Mode, train: object) -> Mode:
    """The mode that ``owner``'s deprecated ``train=`` keyword names, with a
    ``DeprecationWarning`` pointing at the caller of ``owner`` (the function that calls this).

    Raises:
        TypeError: if ``mode`` is not the default ``"auto"`` (both given), or ``train`` is not
            a 0.3 value.
    """
    if mode != "auto":
        raise TypeError(
            f"{owner}() got both mode={mode!r} and its deprecated alias train={train!r}; "
            "pass mode= only"
        )
    new = mode_of_train(train)
    warnings.warn(
        f"{owner}(train={train!r}) was renamed to mode={new!r}; the alias will be removed in 1.1",
        DeprecationWarning,
        stacklevel=3,
    )
    return new
