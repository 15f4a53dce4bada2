"""Datasets in the Extreme Classification Repository's formats: the file formats
(xc_format, xc_lines, sparse_rows, sparse_reader), loading a data directory with its
tokenized cache (dataset, tokenize, label_cache, cache_files), the paper's dataset catalog,
the synthetic stand-ins, the validation split, label subsets, own-item filtering, per-row
set operations (rowsets) and the typed training batch (batch).

Layer 2 of 13: may import runtime.
"""
