"""Data-parallel training on ``torch.distributed``: the step, selection across ranks, keys,
sharded data and checkpoints (see ``docs/how-to/distributed.md``).

* :class:`DataParallel`: the step's ``replicas`` (``make_train_step(..., replicas=
  DataParallel())``, or :func:`make_data_parallel_step`): gradient and loss are the mean over
  all ranks' kept rows (a bucketed all-reduce, eager or compiled).
* :func:`local_selection`, :func:`global_selection`: a policy wrapped to select per rank or
  over the global batch (``SelectiveBackprop(policy=global_selection(policy))``), optionally
  rebalancing kept rows across ranks.
* :func:`per_rank`: an algorithm drawing from its own stream on every rank (augmentations).
* :func:`shard_ids`, :func:`sharded_batches`: each rank's slice of a keyed permutation.
* :func:`save_data_parallel`, :func:`load_data_parallel`: one checkpoint per run, resumed bit
  for bit.
* :class:`Comm`, :class:`TrafficMeter` and the ``*_traffic`` predictions: the bytes moved.

Everything works without an initialised process group, as a world of one.
"""

from sbfunc._namespace import Namespace, api_dir, moved_names
from sbfunc.distributed._balance import ExchangePlan, balanced_counts, exchange_plan
from sbfunc.distributed._checkpoint import (
    RankLocal,
    join_state,
    load_data_parallel,
    replica_mismatches,
    save_data_parallel,
    split_state,
)
from sbfunc.distributed._comm import DEFAULT_BUCKET_BYTES, Comm
from sbfunc.distributed._data import shard_ids, sharded_batches
from sbfunc.distributed._keys import per_rank, rank_key
from sbfunc.distributed._mean import mean_across_ranks
from sbfunc.distributed._meter import Traffic, TrafficMeter
from sbfunc.distributed._packing import RowLayout, batch_rows, pack_rows, unpack_rows, with_rows
from sbfunc.distributed._scope import global_selection, local_selection
from sbfunc.distributed._step import BufferSync, DataParallel, make_data_parallel_step
from sbfunc.distributed._traffic import gather_traffic, gradient_traffic, rebalance_traffic

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "BufferSync",
    "Comm",
    "DataParallel",
    "ExchangePlan",
    "RankLocal",
    "RowLayout",
    "Traffic",
    "TrafficMeter",
    "balanced_counts",
    "batch_rows",
    "exchange_plan",
    "gather_traffic",
    "global_selection",
    "gradient_traffic",
    "join_state",
    "load_data_parallel",
    "local_selection",
    "make_data_parallel_step",
    "mean_across_ranks",
    "pack_rows",
    "per_rank",
    "rank_key",
    "rebalance_traffic",
    "replica_mismatches",
    "save_data_parallel",
    "shard_ids",
    "sharded_batches",
    "split_state",
    "unpack_rows",
    "with_rows",
]

__getattr__ = moved_names(
    "sbfunc.distributed",
    (
        "1.1",
        {
            "save": "sbfunc.distributed:save_data_parallel",
            "load": "sbfunc.distributed:load_data_parallel",
            "mean": Namespace(("sbfunc.distributed", ("mean_across_ranks",))),
        },
    ),
)
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
