"""Deprecated in 1.1: the ordering passes live on :mod:`sbfunc.engine` (their one home), e.g.
``sbfunc.engine.register_pass``; every name here warns and is removed in 1.2."""

from sbfunc._namespace import moved_names

__getattr__ = moved_names(
    "sbfunc.passes",
    (
        "1.1",
        (
            "sbfunc.engine",
            (
                "COMPOSER_PASSES",
                "DEFAULT_PASSES",
                "MultipleLossInterpolationWarning",
                "Pass",
                "order_by_phase",
                "phase",
                "register_pass",
                "set_filo_order",
                "sort_fused_layernorm_last",
                "sort_selective_backprop_first",
                "sort_to_back",
                "sort_to_front",
                "warn_if_multiple_loss_interpolation",
            ),
        ),
    ),
)


def __dir__() -> list[str]:
    return []
