"""Embedded datasets for examples, tests and studies: nothing is downloaded.

* :func:`mnist1d` generates the MNIST-1D benchmark procedurally with
  ``mnist1d.data.make_dataset`` (needs the ``examples`` extra: ``pip install "sbfunc[examples]"``);
  the download path ``get_dataset`` is never used.
* :func:`digits` loads scikit-learn's bundled 8x8 digits (1797 images, shipped in the wheel).
* :func:`stdlib_corpus` cuts the running interpreter's standard library source into
  byte-level rows for a causal language model (:data:`VOCAB_SIZE` tokens: 256 bytes and
  :data:`PAD_ID`), with a digest that names the data; :func:`split_corpus` splits it by file
  into train, held-out and reference sets, :func:`mixed_stream` replaces a fraction of the
  rows by random bytes or English prose (``pydoc_data``), tagged by ``kind``
  (:data:`KINDS`), and :func:`byte_rows` encodes any text the same way.
* :func:`batches` cuts tensors into shuffled minibatches from an explicit key,
  :func:`dict_batches` a dict of rows (the text rows) into dict batches.

Example:
    >>> corpus = sbfunc.datasets.stdlib_corpus(seq_len=32, max_bytes=10_000)
    >>> parts = sbfunc.datasets.split_corpus(corpus, heldout=0.2, key=sbfunc.random.key(0))
    >>> stream = sbfunc.datasets.mixed_stream(parts.train, corpus.english, random_fraction=0.25,
    ...                                       key=sbfunc.random.key(1))
    >>> batch = next(sbfunc.datasets.dict_batches(stream, 8, key=sbfunc.random.key(2)))
    >>> {name: tuple(t.shape) for name, t in batch.items()}
    {'input_ids': (8, 32), 'attention_mask': (8, 32), 'labels': (8, 32), 'ids': (8,), 'kind': (8,)}
"""

from sbfunc._namespace import api_dir
from sbfunc.datasets._arrays import Split, batches, dict_batches, digits, mnist1d, with_label_noise
from sbfunc.datasets._mixed import mixed_stream
from sbfunc.datasets._text import (
    IGNORE_INDEX,
    KINDS,
    PAD_ID,
    VOCAB_SIZE,
    TextCorpus,
    TextSplit,
    byte_rows,
    split_corpus,
    stdlib_corpus,
)

__all__ = [
    "IGNORE_INDEX",
    "KINDS",
    "PAD_ID",
    "VOCAB_SIZE",
    "Split",
    "TextCorpus",
    "TextSplit",
    "batches",
    "byte_rows",
    "dict_batches",
    "digits",
    "mixed_stream",
    "mnist1d",
    "split_corpus",
    "stdlib_corpus",
    "with_label_noise",
]

__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
