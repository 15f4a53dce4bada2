"""Nearest-label search over W: the exact and ScaNN indexes the hard-negative refresh
and serving both build (index), ScaNN built in groups for shards of millions of rows
(grouped_index), exact blocked top-k (exact_topk), and exact top-k over W's shards on the
mesh (sharded_topk).

Layer 6 of 13: may import runtime, data, model, parallel, xc.
"""
