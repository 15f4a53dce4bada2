"""Negatives for a training step: the strategy registry (strategies; add a
sampling strategy there), the per-epoch split of k_h and k_r (schedule), the sampler that
draws them, the refresh manager that keeps stale hard negatives coming (manager) with its
per-process view of them (held_blocks), the refresh worker that mines them off the critical
path (refresh), and mining with an index (mining).

Layer 7 of 13: may import runtime, data, model, parallel, xc, ann.
"""
