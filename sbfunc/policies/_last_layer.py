"""Diversified batch selection (DivBS): keep the rows whose last-layer gradients together best
cover the batch's summed gradient, as a pure function of fixed shapes.

The feature of row ``i`` is the last linear layer's per-sample gradient of the cross-entropy,
``g_i = (softmax(z_i) - onehot(y_i)) outer h_i`` (``h_i`` the penultimate activation), whose
inner products factor, ``<g_i, g_j> = <p_i - e_i, p_j - e_j> * <h_i, h_j>``: the Gram matrix
(:func:`gradient_gram`) costs ``N * N * (C + d)`` instead of materialising ``N`` vectors of
``C * d``. :func:`divbs_indices` then runs the greedy selection on the Gram matrix alone.

References:
    Hong et al. 2024, "Diversified Batch Selection for Training Acceleration" (ICML);
    code: github.com/Feng-Hong/DivBS, ``methods/DivBS.py`` (``greedy_selection``).
"""

from __future__ import annotations

import torch

from sbfunc.validation import check_tensor

__all__ = ["at_least_float32", "gradient_gram", "last_layer_errors"]


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def last_layer_errors(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The cross-entropy's gradient with respect to the logits, ``softmax(z) - onehot(y)``, per
    row (the sum-reduced loss's; a mean only rescales every row alike).

    Args:
        logits: ``Tensor[N, C]`` floating.
        targets: ``int64 Tensor[N]`` of class indices in ``[0, C)`` (not checked on the host:
            an index out of range gives the row no one-hot term).

    Returns:
        ``Tensor[N, C]`` in the logits' dtype promoted to at least float32.

    Example:
        >>> from sbfunc.policies import last_layer_errors
        >>> last_layer_errors(torch.zeros(2, 2), torch.tensor([0, 1]))
        tensor([[-0.5000,  0.5000],
                [ 0.5000, -0.5000]])
    """
    check_tensor(logits, "logits", dim=2, floating=True)
    check_tensor(targets, "targets", dim=1, size=logits.shape[0], floating=False)
    probs = torch.softmax(logits.to(at_least_float32(logits.dtype)), dim=1)
    classes = torch.arange(logits.shape[1], device=logits.device)
    return probs - (targets.unsqueeze(1) == classes).to(probs.dtype)


def gradient_gram(errors: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The Gram matrix of the last-layer gradient embeddings ``g_i = errors_i outer
    features_i``: ``(E E^T) * (H H^T)``, without materialising any ``g_i``.

    For a last layer with a bias, append a column of ones to ``features`` (the bias's gradient
    is ``errors_i`` itself).

    Args:
        errors: ``Tensor[N, C]`` floating, e.g. :func:`last_layer_errors`.
        features: ``Tensor[N, d]`` floating, the penultimate activations.

    Returns:
        ``Tensor[N, N]``, symmetric positive semi-definite, in the promoted dtype of the two
        (at least float32).

    Example:
        >>> from sbfunc.policies import gradient_gram
        >>> gradient_gram(torch.tensor([[1.0, -1.0], [0.5, 0.0]]), torch.eye(2))
        tensor([[2.0000, 0.0000],
                [0.0000, 0.2500]])
    """
    check_tensor(errors, "errors", dim=2, floating=True)
    check_tensor(features, "features", dim=2, size=errors.shape[0], floating=True)
    dtype = at_least_float32(torch.promote_types(errors.dtype, features.dtype))
    e, h = errors.to(dtype), features.to(dtype)
    return (e @ e.T) * (h @ h.T)
