"""Experiment configuration: the defaults every experiment starts from and their
validation (base), and the paper's hyper-parameter table as configs (paper_configs).

Layer 10 of 13: may import the layers 1-9 (runtime ... evaluation).
"""
