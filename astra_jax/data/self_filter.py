"""Each row's own item among the labels: pairs (row, label) whose texts are the same.

On datasets whose data points and labels are items of one catalogue (products that
recommend products, packages that recommend packages, articles that link articles), a point
is often a label too, and by construction never its own: LF-AmazonTitles' and
LF-WikiSeeAlso's filter files (`data.filter_file`) list exactly these (point, itself)
pairs, which the evaluation removes from the rankings. A dataset built the same way without
a filter file (debian-recommends-20k: 45% of its points are also labels) gets them from
the texts with `data.filter_self`: a label whose text is the row's text is the row's item.
With `auto` the training split decides: the filter is on when the training rows' own items
are (almost) never among their labels, so data whose queries equal their labels' texts
(search queries and ad titles) keep those labels. Without the filter, any score that reads
the label texts ranks the item itself first (its text is the query's), a guaranteed miss
on every such row.
"""

from __future__ import annotations

import numpy as np
from absl import logging


def identical_text_pairs(row_texts: list[str], label_texts: list[str]) -> np.ndarray:
  """(m, 2) int64 (row, label) pairs whose texts are equal after stripping whitespace at
  their ends, sorted by row; a text that several labels share pairs with each of them."""
  by_text: dict[str, list[int]] = {}
  for label, text in enumerate(label_texts):
    by_text.setdefault(text.strip(), []).append(label)
  pairs = [
    (row, label) for row, text in enumerate(row_texts) for label in by_text.get(text.strip(), ())
  ]
  return np.asarray(pairs, np.int64).reshape(-1, 2)


# "auto" filters when at most this share of the training rows' own-item pairs are positives.
AUTO_MAX_POSITIVE_SHARE = 0.01


def own_item_is_never_a_label(train_pairs: np.ndarray, train_labels) -> tuple[bool, float]:
  """Whether the training labels say that a row's own item is not among its labels.

  The rule of `data.filter_self=auto`: on a catalogue whose points never list themselves
  (share 0) the filter removes only misses; where a query's text is often its label's (a
  search query equal to an ad's title) the share is high and nothing is filtered.

  Args:
    train_pairs: (m, 2) (training row, label) pairs of a row and its own item.
    train_labels: the training rows' labels (SparseRows-like: `row(i)`).
  Returns:
    (the decision, the share of `train_pairs` that are positives); (False, 0.0) for none.
  """
  if len(train_pairs) == 0:
    return False, 0.0
  share = positive_share(train_pairs, train_labels)
  return share <= AUTO_MAX_POSITIVE_SHARE, share


def positive_share(pairs: np.ndarray, labels) -> float:
  """The share of (row, label) `pairs` whose label is among the row's `labels` (0 for none)."""
  if len(pairs) == 0:
    return 0.0
  hits = sum(int(label in set(labels.row(int(row)).tolist())) for row, label in pairs)
  return hits / len(pairs)


def own_item_pairs(
  mode: str,
  train_texts: list[str],
  train_labels,
  test_texts: list[str],
  test_labels,
  label_texts: list[str],
) -> tuple[np.ndarray, np.ndarray, float]:
  """`data.filter_self`'s decision and pairs, for the training run and the baselines alike.

  The filter removes labels from the rankings only. Where no test row's own item is among
  its labels (debian-recommends-20k: 0 of 2,335), a filtered P@k is the unfiltered P@k of
  a predictor that never ranks a row's own item, as the exported model does; where some
  are, filtering hides true labels, and a warning says how many.

  Args:
    mode: "on" or "auto" ("off" is the caller's: it reads no texts).
    train_texts, train_labels: the training rows' texts and labels.
    test_texts, test_labels: the evaluated rows' texts and labels.
    label_texts: every label's text.
  Returns:
    (training rows' own-item pairs, test rows' own-item pairs, share of the training pairs
    that are positives); both pair arrays are empty when the filter is off.
  """
  train_pairs = identical_text_pairs(train_texts, label_texts)
  on, share = own_item_is_never_a_label(train_pairs, train_labels)
  if mode != "on" and not on:
    empty = np.zeros((0, 2), np.int64)
    return empty, empty, share
  test_pairs = identical_text_pairs(test_texts, label_texts)
  test_share = positive_share(test_pairs, test_labels)
  if test_share:
    logging.warning(
      "data.filter_self: %.1f%% of the test rows' own items are among their labels: "
      "filtering them removes true labels from the rankings",
      100 * test_share,
    )
  return train_pairs, test_pairs, share
