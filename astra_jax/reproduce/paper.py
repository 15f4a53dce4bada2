"""The paper's numbers, from its tables, that the reproduced tables print beside ours, and the
tables that need the real datasets and GPUs."""

from __future__ import annotations

# tab:rq3, LF-AmazonTitles-131K column: strategy -> (P@1, P@5).
# Our "curriculum" is the paper's "curriculum learning (w hard)", "curriculum+e_hard" its
# "curriculum learning (E hard)".
PAPER_RQ3 = {
  "random": (44.57, 21.83),
  "e_hard": (41.98, 19.07),
  "random+e_hard": (45.55, 21.55),
  "curriculum+e_hard": (45.84, 21.75),
  "w_hard": (41.74, 20.79),
  "curriculum": (45.83, 21.58),
  "random+w_hard": (46.20, 21.95),
}
# tab:tau_s_ablation / tab:tau_r_ablation, LF-Amazon-131K column: value -> (P@1, P@5).
PAPER_TAU_S = {5: (47.13, 22.35), 10: (46.29, 21.96), 20: (46.24, 21.97)}
PAPER_TAU_R = {5: (47.13, 22.35), 10: (46.28, 21.95), 20: (46.02, 21.84)}
# tab:ratio_ablation, LF-AmazonTitles-131K column: (k_h, k_r) per GPU -> (P@1, P@5).
PAPER_RATIO = {
  (50, 400): (46.20, 21.95),
  (50, 300): (46.25, 21.92),
  (50, 200): (46.23, 21.89),
  (50, 100): (46.17, 21.79),
  (30, 400): (46.15, 21.91),
  (30, 100): (46.12, 21.75),
  (20, 400): (46.10, 21.92),
  (20, 300): (46.12, 21.89),
}
# tab:timebreakup: (dataset, L) -> {row: (Renee ms, ASTRA ms)}; None = N/A.
PAPER_TIME = {
  ("LFAT-131K", 131_073): {
    "data_prep": (0.1, 0.2),
    "host_to_device": (0.3, 0.3),
    "encoder_forward": (14.3, 14.2),
    "clf_forward": (0.6, 1.3),
    "loss": (None, 0.3),
    "backward_update": (20.4, 21.9),
    "sum": (35.4, 38.2),
  },
  ("LFAT-1.3M", 1_305_265): {
    "data_prep": (0.1, 0.2),
    "host_to_device": (0.3, 0.3),
    "encoder_forward": (14.4, 14.4),
    "clf_forward": (5.4, 1.4),
    "loss": (None, 0.3),
    "backward_update": (39.6, 31.6),
    "sum": (98.3, 48.1),
  },
  ("SS-20M", 19_049_952): {
    "data_prep": (0.1, 0.2),
    "host_to_device": (0.3, 0.3),
    "encoder_forward": (14.3, 14.5),
    "clf_forward": (76.8, 1.6),
    "loss": (None, 0.3),
    "backward_update": (183.3, 32.2),
    "sum": (274.8, 49.1),
  },
}
# tab:memory, GPU MB: dataset -> (L, Renee, ASTRA, the paper's reduction).
PAPER_MEMORY = {
  "LF-AmazonTitles-131K": (131_073, 128.00, 2.06, 62.2),
  "LF-Amazon-131K": (131_073, 128.00, 1.91, 67.1),
  "Amazon-670K": (670_091, 327.19, 3.57, 91.6),
  "LF-AmazonTitles-1.3M": (1_305_265, 2549.35, 3.81, 668.7),
  "Amazon-3M": (2_812_281, 1373.18, 3.91, 351.5),
}

NEEDS_GPUS = {  # tables with the real datasets' accuracy and wall-clock speed-ups
  "rq1": "python -m astra_jax.main --config=experiments/ss20m.py (and ss120m.py) "
  "--workdir=workdir/ss20m",
  "rq2_table_1": "python -m astra_jax.main --config=experiments/lf_amazontitles_131k.py "
  "(lf_amazon_131k.py, lf_wikipedia_500k.py, lf_amazontitles_1_3m.py) "
  "--workdir=workdir/NAME, with --config.negatives.strategy=full for Renee",
}
