"""``torch.compile`` of the data-parallel step on two gloo ranks equals the eager step.

The one compile test of the package: the gradient all-reduce is traced as functional
collectives inside the graph (with ``aot_eager``: dynamo's and AOTAutograd's graphs, the
collectives in them, without inductor's code generation, which tests/step/test_compile.py
covers).
"""

import torch

from tests.distributed import job

TIMEOUT_S = 480


def test_compiled_step_equals_eager_on_two_ranks(tmp_path):
    for results in job.launch(["compiled"], tmp_path, timeout_s=TIMEOUT_S):
        eager, compiled = results["compiled"]["eager"], results["compiled"]["compiled"]
        assert len(eager) == len(compiled) == 3
        for a, b in zip(eager, compiled, strict=True):
            torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-6)
            for k in a.params:
                torch.testing.assert_close(b.params[k], a.params[k], rtol=1e-5, atol=1e-6)
        breaks = " ".join(results["compiled"]["graph_breaks"])
        assert "c10d" not in breaks and "collective" not in breaks
