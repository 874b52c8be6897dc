"""The options ``step.compile()`` passes to ``torch.compile``, and the guards it keeps.

``step.compile()`` compiles the step's core alone and runs its host ``plan`` and ``finish``
as plain Python around it (``sbfunc.step.TrainStep``). ``torch.compile`` guards every global a
traced function reads; tracing a step reads hundreds of them in sbfunc's and torch's own
modules (833 global guards for a Selective Backprop step, about as many as every other guard
together), fixed once the library is imported, and checking them on every call costs more
than a small model's arithmetic. :func:`drop_library_globals`, the default
``guard_filter_fn``, drops exactly those and keeps every guard on the step's inputs and on
globals of any other module (a model's ``forward``, an algorithm of yours), which still
recompile when they change; patching sbfunc or torch after compiling is not seen
(``step.compile(library_guards=True)`` keeps every guard).

More in ``docs/how-to/compile.md``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["compile_options", "drop_library_globals", "library_global"]

_LIBRARIES = ("sbfunc", "torch", "optree", "kornia")
_IMPORT = re.compile(r"G\['__import_(\w+?)'\]")
_ROOT = re.compile(r"G\['([^']+)'\]")
_ROOT_MODULE = "sbfunc.step._train_step"  # the module of the compiled core (its G[...] globals)


def _library(module: str) -> bool:
    root = module.split(".")[0]
    return root in _LIBRARIES or root in sys.stdlib_module_names


def library_global(name: str) -> bool:
    """Whether a guard's source ``name`` is a global of a library or standard module (or a
    builtin), rather than of user code.

    Example:
        >>> library_global("G['__import_sbfunc_dot_batch'].torch")
        True
        >>> library_global("G['CoreOutputs']")  # a global of the step's own module
        True
        >>> library_global("G['__import_my_model'].SCALE")
        False
    """
    found = _IMPORT.match(name)
    if found is not None:  # a global reached through an imported module
        return _library(found.group(1).replace("_dot_", "."))
    found = _ROOT.match(name)
    if found is None:
        return False
    root = found.group(1)
    if root.startswith("__builtins_dict__"):
        return True
    module = sys.modules.get(_ROOT_MODULE)
    value = None if module is None else vars(module).get(root)
    return value is not None and _library(getattr(value, "__module__", None) or root)


def drop_library_globals(entries: Sequence[Any]) -> list[bool]:
    """``torch.compile``'s ``guard_filter_fn``: keep every guard but those on library globals
    (see the module docs).

    Example:
        >>> from types import SimpleNamespace as Entry  # torch's GuardFilterEntry has these
        >>> drop_library_globals([Entry(name="G['torch'].sin", is_global=True),
        ...                       Entry(name="L['batch'][0]", is_global=False),
        ...                       Entry(name="G['__import_my_model'].SCALE", is_global=True)])
        [False, True, True]
    """
    return [not (e.is_global and library_global(e.name)) for e in entries]


_DYNAMIC = (
    "step.compile(dynamic=True) is not supported: it makes every number dynamic, the step's "
    "hyperparameters (keep fractions, scale factors) included, and sbfunc compiles those as "
    "constants of the step. Leave dynamic unset (a batch of a new size recompiles once with "
    "a dynamic batch dimension: torch's automatic dynamic shapes) or pass dynamic=False"
)


def compile_options(options: dict[str, Any], *, library_guards: bool) -> dict[str, Any]:
    """``torch.compile`` keyword arguments with :func:`drop_library_globals` as the
    ``guard_filter_fn`` (unless ``library_guards`` or the caller set one).

    The filter travels in inductor's ``options``, which ``torch.compile`` refuses together with
    ``mode``: a ``mode`` alone becomes the options it stands for
    (``torch._inductor.list_mode_options``, as ``torch.compile`` expands it), so
    ``mode="reduce-overhead"`` still means CUDA graphs. With another backend and a ``mode``,
    or with both ``mode`` and ``options``, the arguments pass unchanged (no filter).

    Example:
        >>> opts = compile_options({"mode": "reduce-overhead"}, library_guards=False)
        >>> sorted(opts["options"]), "mode" in opts
        (['guard_filter_fn', 'triton.cudagraphs'], False)
    """
    if not isinstance(library_guards, bool):
        raise TypeError(f"library_guards must be True or False, got {library_guards!r}")
    if options.get("dynamic") is True:
        raise ValueError(_DYNAMIC)
    opts = dict(options)
    if library_guards:
        return opts
    mode = opts.get("mode")
    if mode is not None:
        if opts.get("options") is not None or opts.get("backend", "inductor") != "inductor":
            return opts
        from torch._inductor import list_mode_options

        opts["options"] = dict(list_mode_options(mode, opts.get("dynamic")))
        del opts["mode"]
    inner = dict(opts.get("options") or {})
    inner.setdefault("guard_filter_fn", drop_library_globals)
    opts["options"] = inner
    return opts
