"""Scoring rankings: XC metrics (metrics; add a metric there), rank -> filter
-> score for every evaluation (ranking), the resumable final evaluation (final_eval),
evaluation through the serving index (ann_eval), kNN votes, the classic baselines and the
XC libraries users compare with (peers, run by peer_runner in their own environment), and the
metric tables the tools print.

Layer 9 of 13: may import the layers 1-8 (runtime ... serving).
"""
