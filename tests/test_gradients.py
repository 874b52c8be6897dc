"""``differentiate`` (sbfunc/_gradients.py) under the compiler: the aux's non-tensor leaves
come back as they went in."""

import torch

from sbfunc._gradients import differentiate


def test_an_int_of_the_aux_that_turns_dynamic_still_compiles():
    """Recompiled for a new ``n``, the int leaf of the aux is a SymInt; torch 2.11's dynamo
    failed on ``SymInt is object()``, the tensor marker ``differentiate`` used to compare with."""

    def f(w: torch.Tensor, n: int):
        return differentiate(lambda p: ((p["w"] ** 2).sum() * n, (p["w"] * 2, n, None)), {"w": w})

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    w = torch.tensor([1.0, -2.0])
    for n in (2, 3, 4):
        grads, loss, aux = compiled(w, n)
        eager = f(w, n)
        torch.testing.assert_close(grads["w"], eager[0]["w"])
        torch.testing.assert_close(loss, eager[1])
        assert torch.equal(aux[0], eager[2][0]) and aux[1:] == (n, None)
