"""Compatibility layers for other libraries' APIs: Composer's functional Selective Backprop,
:func:`select_using_loss`, fixed and validated (its schedule, Composer's
``should_selective_backprop``, is :func:`sbfunc.selective_backprop.should_selective_backprop`)."""

from sbfunc._namespace import Namespace, api_dir, moved_names
from sbfunc.compat._composer import select_using_loss

__all__ = ["select_using_loss"]

__getattr__ = moved_names(
    "sbfunc.compat",
    (
        "1.1",
        {
            "composer": Namespace(
                {
                    "select_using_loss": "sbfunc.compat:select_using_loss",
                    "should_selective_backprop": (
                        "sbfunc.selective_backprop:should_selective_backprop"
                    ),
                }
            )
        },
    ),
    ("1.2", ("sbfunc.selective_backprop", ("should_selective_backprop",))),
)
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
