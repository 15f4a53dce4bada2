"""The encoder's lookup table updated only where a step reads it (`optim.encoder_table_update
=rows`): Adam over the gathered rows, as LazyAdam does (TF Addons, the sparse embedding
updates of fastText and StarSpace).

An n-gram bag's table has far more rows than a batch reads: the recipe's 2^17 x 256 table
against the ~12k rows that 128 queries of 93 n-grams touch. Dense Adam reads and writes the
whole table, its two moments and its gradient every step, and that traffic was most of the
step (docs/results/builddeps.md). Here the step

  1. finds the rows the batch reads (`touched`: their unique ids, padded to a fixed count
     so that the step compiles once, and each n-gram's position among them),
  2. differentiates the loss w.r.t. those gathered rows (and the encoder's other
     parameters) instead of the table,
  3. runs the encoder's own optax chain on the gathered rows and their gathered moments,
     the rest of the encoder's parameters and state as they are, and
  4. writes the rows and moments back (`put_rows`).

What a row reads then differs from dense Adam only for rows the batch does not read: they
keep their value and moments, where dense Adam would decay the moments and move the row by
its momentum. Adam's step count and bias correction stay global. Weight decay on the table
(`optim.encoder_weight_decay`) likewise reaches the rows read. Gradient clipping by the
global norm is unchanged: the rows not read have zero gradient.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class Touched(NamedTuple):
  """The table rows a batch reads.

  Attributes:
    ids: (U,) int32 the rows, ascending, padded with the table's size (a row that does not
      exist: its gather is clamped and its write dropped).
    local: (..., G) int32 each n-gram's position in `ids`.
    mask: (..., G) bool whether the n-gram is real.
    size: the table's row count.
  """

  ids: jax.Array
  local: jax.Array
  mask: jax.Array
  size: int


def capacity(batch_rows: int, grams_per_row: int, table_size: int) -> int:
  """U, the rows a step can read: every n-gram of every row distinct, at most the table."""
  return min(batch_rows * grams_per_row, table_size)


def touched(rows: jax.Array, mask: jax.Array, table_size: int) -> Touched:
  """The unique rows of `rows` (..., G) read where `mask` is set.

  Args:
    rows: the table rows each n-gram reads.
    mask: which n-grams are real (the others read no row).
    table_size: the table's row count.
  Returns:
    Touched with U = capacity(rows per batch, G, table_size) ids.
  """
  size = capacity(rows.size // rows.shape[-1], rows.shape[-1], table_size)
  read = jnp.where(mask, rows, table_size).ravel()
  ids, local = jnp.unique(read, size=size, fill_value=table_size, return_inverse=True)
  # An n-gram that is not real points at a padding slot or at the fill value's slot; the
  # pooling's mask zeroes what it reads either way.
  return Touched(
    ids.astype(jnp.int32), local.reshape(rows.shape).astype(jnp.int32), mask, table_size
  )


def _at(path, table_path: tuple[str, ...]) -> bool:
  """Whether a tree path ends with the table's path (its keys, indices aside)."""
  names = tuple(k.key for k in path if hasattr(k, "key"))
  return names[-len(table_path) :] == table_path


def _is_table(path, leaf, table_path: tuple[str, ...], table_size: int) -> bool:
  return (
    hasattr(leaf, "shape")
    and leaf.ndim >= 1
    and leaf.shape[0] == table_size
    and _at(path, table_path)
  )


def take_rows(tree: Any, table_path: tuple[str, ...], table_size: int, ids: jax.Array) -> Any:
  """`tree` (parameters, or optimizer state holding per-parameter moments) with every
  leaf of the table's path and shape replaced by its rows `ids`."""

  def take(path, leaf):
    if _is_table(path, leaf, table_path, table_size):
      return jnp.take(leaf, ids, axis=0, mode="clip")
    return leaf

  return jax.tree_util.tree_map_with_path(take, tree)


def put_rows(
  full: Any, rows: Any, table_path: tuple[str, ...], table_size: int, ids: jax.Array
) -> Any:
  """`full` with the table leaves' rows `ids` set from `rows` (`take_rows`' layout) and
  every other leaf replaced by `rows`' (they were updated whole)."""

  def put(path, whole, part):
    if _is_table(path, whole, table_path, table_size):
      return whole.at[ids].set(part.astype(whole.dtype), mode="drop")
    return part

  return jax.tree_util.tree_map_with_path(put, full, rows)


def table_size(tree: Any, table_path: tuple[str, ...]) -> int:
  """The row count of the parameter at `table_path` in `tree` (the encoder's parameters)."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if _at(path, table_path):
      return int(leaf.shape[0])
  raise ValueError(f"the encoder has no parameter at {'/'.join(table_path)}")


def cut(graphdef, encoder: Any, input_ids: jax.Array, table_path: tuple[str, ...]):
  """The rows a batch (..., T) reads, and the encoder's parameters with its table cut to
  them (what the step differentiates).

  Returns:
    (Touched with local ids of shape input_ids.shape[:-1] + (G,), the cut parameters).
  """
  size = table_size(encoder, table_path)
  flat = input_ids.reshape(-1, input_ids.shape[-1])
  rows, mask = nnx.merge(graphdef, encoder).table_rows(flat)
  shape = input_ids.shape[:-1] + rows.shape[-1:]
  read = touched(rows.reshape(shape), mask.reshape(shape), size)
  return read, take_rows(encoder, table_path, size, read.ids)


def encode(graphdef, enc_params, rows: jax.Array, mask: jax.Array, key: jax.Array):
  """`steps.encode` of the cut encoder: `rows` (B, G) index its table of the rows read,
  `mask` (B, G) marks the real n-grams. Returns (E(x) after dropout, before it)."""
  encoder = nnx.merge(graphdef, enc_params)
  pooled = encoder.pool(*encoder.states_of_rows(rows, mask))
  return encoder.embedding_dropout(pooled, key), pooled


def update(
  tx: optax.GradientTransformation,
  grads: Any,
  cut_params: Any,
  state: Any,
  table_path: tuple[str, ...],
  read: Touched,
) -> tuple[Any, Any]:
  """One step of the encoder's chain `tx` on the rows read (module docstring).

  Args:
    tx: the encoder's optax chain.
    grads: the gradient w.r.t. `cut_params`.
    cut_params: the cut parameters (`cut`).
    state: the train state (its `encoder` and `opt`, the whole table's).
    table_path: the table's path.
    read: the rows read.
  Returns:
    (the encoder's parameters, its optimizer state), the whole table's.
  """
  opt_rows = take_rows(state.opt, table_path, read.size, read.ids)
  updates, opt_rows = tx.update(grads, opt_rows, cut_params)
  new = optax.apply_updates(cut_params, updates)
  return (
    put_rows(state.encoder, new, table_path, read.size, read.ids),
    put_rows(state.opt, opt_rows, table_path, read.size, read.ids),
  )
