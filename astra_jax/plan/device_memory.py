"""What one device holds in training: W's shard, the classifier's optimizer state, the
encoder's parameters, Adam moments and gradients, its activations for one micro-batch and
the classifier step's temporaries."""

from __future__ import annotations

from astra_jax.plan.inputs import activation_bytes
from astra_jax.plan.quantities import Quantities
from astra_jax.plan.records import Item


def device_items(config, q: Quantities) -> list[Item]:
  """The items of one device's memory (module docstring), each with its formula."""
  P, d, L, R, A, B, s, T = q.P, q.d, q.L, q.R, q.A, q.B, q.s, q.T
  enc, dense, micro, b_enc, b_clf = q.enc, q.dense, q.micro, q.b_enc, q.b_clf
  k_p, k_h, k_r, schedule = q.k_p, q.k_h, q.k_r, q.schedule
  dev = [Item(f"W shard ({R:,} rows x {d}, fp32)", R * d * 4, "ceil(L / model) x d x 4")]
  if dense:
    mom = L * d * 4 if config.optim.classifier_momentum else 0
    dev.append(Item("classifier optimizer state (dense SGD momentum)", mom, "L x d x 4"))
  elif config.optim.classifier_momentum:
    # sparse_momentum.py: a second array like W (each row's fast coordinate); its period's
    # coefficients (at most 4,098 x 6 floats) are left out.
    dev.append(
      Item(
        "classifier optimizer state (sparse momentum: a velocity per row)",
        R * d * 4,
        "ceil(L / model) x d x 4",
      )
    )
  else:
    dev.append(Item("classifier optimizer state (sparse: one scale, one step)", 8, "2 x 4"))
  dev += [
    Item(f"encoder parameters ({P / 1e6:.1f}M, fp32, replicated)", 4 * P, "P x 4"),
    Item("Adam m, v (fp32)", 8 * P, "2 x P x 4"),
    Item(
      "encoder gradients" + (" + accumulation buffer" if A > 1 else ""),
      4 * P * (2 if A > 1 else 1),
      "P x 4" + (" x 2" if A > 1 else ""),
    ),
  ]
  if s != 4:
    dev.append(Item(f"parameters cast to {enc.dtype}", s * P, f"P x {s}"))
  act, act_formula = activation_bytes(enc, b_enc, T)
  layers = getattr(enc, "num_layers", None)  # architecture-specific (a transformer's)
  dev.append(
    Item(
      f"encoder activations ({b_enc} queries x {T} tokens"
      + (f", {layers} layers)" if layers else f", {enc.model_type})"),
      act,
      act_formula,
    )
  )
  if dense:
    dev.append(Item("dense W gradient + update", 2 * L * d * 4, "2 x L x d x 4"))
    if schedule.strategy.mined_in_step:
      dev.append(Item("scores over all labels (uptodate)", micro * L * 4, "B x L x 4"))
    elif schedule.strategy.full_loss:
      blk = config.train.full_label_block
      dev.append(
        Item("full-L blocks (scores, recomputed)", 3 * micro * blk * 4, "3 x B x block x 4")
      )
    return dev
  kk = k_p + k_h + k_r
  # Rows gathered per query: k_p + k_h, + k_r with per-query draws; a shared draw of k_r
  # serves the batch.
  per_query = config.negatives.random_draws == "per_query"
  k_row, k_once, k_txt = (
    (k_p + k_h + k_r, 0, "k_p + k_h + k_r") if per_query else (k_p + k_h, k_r, "k_p + k_h")
  )
  gathered = (b_clf * k_row + k_once) * d * 4
  scores = b_clf * kk * (4 + 4 + 1)
  # Row gradients are all-gathered over 'data' (every replica of a shard applies the same
  # update) and kept for all A micro-batches in factored form: per (query, row) an id and
  # dloss/dscore, per query its embedding (classifier.classifier_grads). The update forms one
  # micro-batch's (rows, d) gradients at a time, scaled for the scatter: x 2.
  kept = B * k_row * 8 + B * d * 4 + A * k_once * (d * 4 + 4)
  formed = 2 * (micro * k_row + k_once) * d * 4
  once = " + k_r" if k_once else ""
  dev.append(
    Item(
      "classifier step: gathered rows + scores, their grads, masks",
      gathered + scores + 2 * b_clf * d * 4,
      f"(B_g ({k_txt}){once}) d 4 + B_g (k_p + k_h + k_r) 9 + 2 B_g d 4",
    )
  )
  dev.append(
    Item(
      "classifier step: row gradients, factored (all micro-batches)",
      kept,
      f"B ({k_txt}) (4 + 4) + B d 4{' + A k_r (d 4 + 4)' if k_once else ''}",
    )
  )
  dev.append(
    Item(
      "classifier update: one micro-batch's row gradients",
      formed,
      f"2 x (B/A ({k_txt}){once}) x d x 4",
    )
  )
  return dev
