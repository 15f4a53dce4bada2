"""The extreme-classification core: the paper's unbiased sampled BCE (loss), the
model-parallel classifier kernel and its O(rows touched) updates (classifier), SGD momentum
on touched rows (sparse_momentum), W's starting rows (classifier_init), and the
label-text-fused score (score_fusion).

Layer 5 of 13: may import runtime, data, model, parallel.
"""
