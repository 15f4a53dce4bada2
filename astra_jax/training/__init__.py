"""One run from config to results: train_and_evaluate (train), the encoder it starts
from (encoder_init), the epoch loop (trainer), the train steps, the optax chain (optim), fp16
loss scaling, the warm-start stage, the numpy input pipeline (pipeline), checkpoints and
exact resume (checkpoint), the workdir's recorded config (run_config), the progress record,
logs, TensorBoard curves, the step-time profile, and results.json (results).

Layer 11 of 13: may import the layers 1-10 (runtime ... config).
"""
