"""A trained model for prediction: the exported model directory (export), its
ScaNN index (serve_index), and the `Predictor` API (predictor).

Layer 8 of 13: may import the layers 1-7 (runtime ... negatives).
"""
