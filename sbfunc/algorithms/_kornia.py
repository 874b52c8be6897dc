"""kornia, the optional dependency of the image algorithms (``pip install 'sbfunc[image]'``).

``import sbfunc`` does not import kornia: the image algorithms (BlurPool, AugMix, RandAugment,
ProgressiveResizing) call :func:`kornia` where they use it. The ``import`` statements below
trace under ``torch.compile(fullgraph=True)``, where ``importlib.import_module`` would not.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["kornia"]

EXTRA = "pip install 'sbfunc[image]'"


def kornia() -> ModuleType:
    """The ``kornia`` package with the submodules sbfunc uses (``enhance``, ``filters``,
    ``geometry.transform``), imported on first use.

    Raises:
        ImportError: kornia is not installed; the message names the extra to install.

    Example:
        >>> kornia().filters.blur_pool2d.__name__
        'blur_pool2d'
    """
    try:
        import kornia.enhance
        import kornia.filters
        import kornia.geometry.transform
    except ImportError as error:
        raise ImportError(f"this image algorithm needs kornia: {EXTRA}") from error
    return kornia
