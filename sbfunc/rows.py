"""Deprecated in 1.1: this module's names live on :mod:`sbfunc.types` (``check_per_sample`` on
:mod:`sbfunc.batch`); each warns, removed in 1.2."""

from sbfunc._namespace import moved_names

__getattr__ = moved_names(
    "sbfunc.rows",
    (
        "1.1",
        {
            **{
                name: f"sbfunc.types:{name}"
                for name in ("ROWS", "LeafFilter", "PerSample", "Rows")
            },
            "check_per_sample": "sbfunc.batch:check_per_sample",
        },
    ),
)


def __dir__() -> list[str]:
    return []
