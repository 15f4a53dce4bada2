"""One run from config to results: train_and_evaluate (train), the epoch loop
(trainer), the train steps, the optax chain (optim), fp16 loss scaling, the warm-start
stage, the numpy input pipeline (pipeline), checkpoints and exact resume, the progress
record, logs, TensorBoard curves and the step-time profile.

Layer 11 of 13: may import the layers 1-10 (runtime ... config).
"""
