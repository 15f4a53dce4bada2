"""Experiment configuration: one module per section with its fields' defaults and their
checks (data, model, negatives, training, evaluation; the error they raise: require), the
whole config, its validation and the check for missing inputs (base), and the paper's
hyper-parameter table as configs (paper_configs).

Layer 10 of 13: may import the layers 1-9 (runtime ... evaluation).
"""
