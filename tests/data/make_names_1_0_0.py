"""Write the names sbfunc 1.0.0's faces exported (kept as test data for tests/test_names_1_0.py).

Run against the 1.0.0 sources, which import under the current environment:

    mkdir /tmp/sbfunc-1.0.0 && git -C <repo> archive 07e572b sbfunc | tar -x -C /tmp/sbfunc-1.0.0
    cd /tmp/sbfunc-1.0.0 && python <repo>/tests/data/make_names_1_0_0.py \
        > <repo>/tests/data/names_1_0_0.json

The faces: ``sbfunc``, every module or package directly below it whose name has no leading
underscore, the submodule 1.0's API reference documented (``sbfunc.distributed.mean``), and
every module a face lists in its ``__all__`` (``sbfunc.compat.composer``). 1.0's other
submodules (``sbfunc.engine.plan``, ...) were undocumented and are left out. The names: each
face's ``__all__``, sorted.
"""

import functools
import importlib
import json
import pkgutil
import sys
import types
import warnings

sys.path.insert(0, ".")  # the 1.0.0 sources, not the installed sbfunc
import sbfunc

assert sbfunc.__version__ == "1.0.0", sbfunc.__file__
warnings.simplefilter("ignore")  # 0.3's aliases
todo = ["sbfunc", "sbfunc.distributed.mean"]
todo += [m.name for m in pkgutil.iter_modules(sbfunc.__path__, "sbfunc.")]
todo = [f for f in todo if not any(p.startswith("_") for p in f.split("."))]
names: dict[str, list[str]] = {}
while todo:
    face = todo.pop()
    module = importlib.import_module(face)
    names[face] = sorted(module.__all__)
    for name in module.__all__:
        value = functools.reduce(getattr, [*face.split(".")[1:], name], sbfunc)
        child = f"{face}.{name}"
        if isinstance(value, types.ModuleType) and child not in names and child not in todo:
            todo.append(child)
json.dump(dict(sorted(names.items())), sys.stdout, indent=1)
print()
