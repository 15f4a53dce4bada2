"""Nearest-label search over W: the exact and ScaNN indexes the hard-negative refresh
and serving both build (index), ScaNN built in groups for shards of millions of rows
(grouped_index), exact blocked top-k (exact_topk), exact top-k over W's shards on the
mesh (sharded_topk), and the neighbour vote's memory of training rows (vote_memory) with
the choice of its search, exact or ScaNN (memory_search).

Layer 6 of 13: may import runtime, data, model, parallel, xc.
"""
