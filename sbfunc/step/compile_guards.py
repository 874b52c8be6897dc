"""Which guards a compiled step keeps: everything but the guards on library globals.

``torch.compile`` guards every global a traced function reads, so that a changed global
recompiles. Tracing a training step reads hundreds of them in sbfunc's and torch's own modules
(functions, classes, constants, module aliases such as ``sbfunc.batch.torch is torch``: 833
global guards for a Selective Backprop step, about as many as every other guard together),
and checking them on every call costs more than the step's own arithmetic on a small model
(``benchmarks/host_overhead.py``). Those globals are fixed once the library is imported.
:func:`drop_library_globals` drops exactly them and keeps every guard on the step's inputs
(tensors, the plan, the state's structure) and on globals of any other module, so code of
yours that the step traces (a model's ``forward``, an algorithm) still recompiles when a global
it reads changes. :meth:`sbfunc.TrainStep.compile` passes it to ``torch.compile``
(``guard_filter_fn``); patching sbfunc or torch after compiling is then not seen.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["compile_options", "drop_library_globals"]

_LIBRARIES = ("sbfunc", "torch", "optree", "kornia")
_IMPORT = re.compile(r"G\['__import_(\w+?)'\]")
_ROOT = re.compile(r"G\['([^']+)'\]")
_ROOT_MODULE = "sbfunc.step.train_step"  # the module of the traced core


def _library(module: str) -> bool:
    root = module.split(".")[0]
    return root in _LIBRARIES or root in sys.stdlib_module_names


def library_global(name: str) -> bool:
    """Whether a guard's source ``name`` is a global of a library or standard module (or a
    builtin), rather than of user code.

    Example:
        >>> from sbfunc.step.compile_guards import library_global
        >>> library_global("G['__import_sbfunc_dot_batch'].torch"), library_global("G['Out']")
        (True, True)
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
        >>> from sbfunc.step.compile_guards import drop_library_globals
        >>> drop_library_globals([Entry(name="G['torch'].sin", is_global=True),
        ...                       Entry(name="L['batch'][0]", is_global=False),
        ...                       Entry(name="G['__import_my_model'].SCALE", is_global=True)])
        [False, True, True]
    """
    return [not (e.is_global and library_global(e.name)) for e in entries]


def compile_options(options: dict[str, Any], *, library_guards: bool) -> dict[str, Any]:
    """``torch.compile`` keyword arguments with :func:`drop_library_globals` as the
    ``guard_filter_fn`` (unless ``library_guards`` or the caller set one).

    The filter travels in inductor's ``options``, which ``torch.compile`` refuses together with
    ``mode``: a ``mode`` alone becomes the options it stands for
    (``torch._inductor.list_mode_options``, as ``torch.compile`` expands it), so
    ``mode="reduce-overhead"`` still means CUDA graphs. With another backend and a ``mode``,
    or with both ``mode`` and ``options``, the arguments pass unchanged (no filter).

    Example:
        >>> from sbfunc.step.compile_guards import compile_options
        >>> opts = compile_options({"mode": "reduce-overhead"}, library_guards=False)
        >>> sorted(opts["options"]), "mode" in opts
        (['guard_filter_fn', 'triton.cudagraphs'], False)
    """
    if not isinstance(library_guards, bool):
        raise TypeError(f"library_guards must be True or False, got {library_guards!r}")
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
