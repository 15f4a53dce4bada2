"""Nearest-label search over W: the ScaNN index the hard-negative refresh and serving
both build (index), exact blocked top-k (exact_topk), and exact top-k over W's shards on the
mesh (sharded_topk).

Layer 6 of 13: may import runtime, data, model, parallel, xc.
"""
