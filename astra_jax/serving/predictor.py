"""A trained model answering texts: `Predictor` (WORKDIR/model, see export.py) ->
predict(texts, k), through the model's ScaNN index (serve_index.py) or exact search over
all of W (`ExactLabels`, W resident on the device). A model whose score mixes in the label
texts (score_fusion.py) or the neighbour vote (neighbour_vote.py) is searched exactly."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from astra_jax.ann import exact_topk
from astra_jax.ann.index import scann_available, warn_scann_missing
from astra_jax.data import tokenize
from astra_jax.runtime.errors import InputError
from astra_jax.serving import export, serve_index
from astra_jax.xc import lexical, neighbour_vote, score_fusion

# Batch sizes the encoder is compiled for: a call pads its texts to the next one (bigger
# calls go in chunks of the last). Sequence lengths likewise go up in powers of two to
# max_len (`seq_buckets`): a short query does not pay for max_len positions, and padding
# is masked out of attention and pooling, so the embedding is the same up to rounding.
# A server compiles at most len(_BUCKETS) x len(seq_buckets) encoder shapes.
_BUCKETS = (1, 4, 16, 64, 256)
# Characters of a text kept before tokenizing. A max_len of at most 512 tokens is reached
# long before this (a token would have to average 195 characters), so the cut only bounds
# the tokenizer's work on absurd inputs; the tokens themselves are truncated to max_len.
MAX_CHARS = 100_000


def _bucket(n: int) -> int:
  return next(b for b in _BUCKETS if b >= n)


def seq_buckets(max_len: int) -> tuple[int, ...]:
  return tuple(sorted({min(2**i, max_len) for i in range(3, max_len.bit_length() + 1)} | {max_len}))


def _chunks(n: int):
  for start in range(0, n, _BUCKETS[-1]):
    yield start, min(start + _BUCKETS[-1], n)


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
  return np.pad(x, ((0, rows - len(x)),) + ((0, 0),) * (x.ndim - 1))


class ExactLabels:
  """Exact search(embeddings, k[, votes]) -> (scores, ids) with W kept on the device in
  label blocks (no per-call copy of W); queries are padded to a bucket size (one compile
  per bucket). With a neighbour `vote`, each search takes the queries' votes and ranks by
  (1 - a) sigmoid(<w_l, E(x)>) + a v(x, l)."""

  def __init__(
    self,
    classifier: np.ndarray,
    label_block: int = 32768,
    vote: neighbour_vote.NeighbourVote | None = None,
  ):
    self.num_labels = len(classifier)
    self.label_block = min(label_block, self.num_labels)
    self.w_blocks = exact_topk.label_blocks(classifier, self.label_block)
    self.vote = vote

  def search(
    self,
    emb: np.ndarray,
    k: int,
    votes: neighbour_vote.Votes | None = None,
    score=None,
  ) -> tuple[np.ndarray, np.ndarray]:
    """Args:
    emb: (n, d') query rows.
    k: labels per query.
    votes: the queries' votes, with a neighbour vote.
    score: the tile score (default: `exact_topk.tile_score` of the vote).
    """
    k = min(k, self.num_labels)
    score = score or exact_topk.tile_score(None, self.vote)
    if self.vote is not None and votes is None:
      raise ValueError("a search with a neighbour vote needs the queries' votes")
    scores, ids = np.empty((len(emb), k), np.float32), np.empty((len(emb), k), np.int32)
    for start, end in _chunks(len(emb)):
      rows = _bucket(end - start)
      q = _pad_rows(np.asarray(emb[start:end], np.float32), rows)
      vi, vv = votes.padded(start, end, rows) if self.vote is not None else (None, None)
      s, i = exact_topk.topk_block(
        jnp.asarray(q),
        self.w_blocks,
        k,
        self.label_block,
        self.num_labels,
        score,
        self.vote,
        vi,
        vv,
      )
      scores[start:end], ids[start:end] = np.asarray(s)[: end - start], np.asarray(i)[: end - start]
    return scores, ids


@dataclasses.dataclass
class Predictions:
  """Row i answers texts[i]. A row with errors[i] set has ids -1 and scores nan."""

  ids: np.ndarray  # (n, k) int32, best first
  scores: np.ndarray  # (n, k) float32, <w_l, E(x)> (or the fused score)
  labels: list[list[str]] | None  # label texts of ids (None: the model has none)
  errors: list[str | None]  # why row i has no prediction
  warnings: list[str | None]  # e.g. the text was truncated

  def record(self, i: int) -> dict:
    """Row i as a JSON-ready dict: ids, scores[, labels][, warning] or error."""
    if self.errors[i]:
      return {"error": self.errors[i]}
    out = {"ids": self.ids[i].tolist(), "scores": [float(s) for s in self.scores[i]]}
    if self.labels is not None:
      out["labels"] = self.labels[i]
    if self.warnings[i]:
      out["warning"] = self.warnings[i]
    return out


def check_text(text) -> tuple[str | None, str | None, str | None]:
  """(text to tokenize or None, error, warning) for one input."""
  if isinstance(text, (bytes, bytearray)):
    try:
      text = bytes(text).decode("utf-8")
    except UnicodeDecodeError as e:
      return None, f"not valid UTF-8 ({e.reason} at byte {e.start})", None
  if not isinstance(text, str):
    return None, f"expected a string, got {type(text).__name__}", None
  if not text.strip():
    return None, "empty query", None
  if len(text) > MAX_CHARS:
    return text[:MAX_CHARS], None, f"text cut to its first {MAX_CHARS} characters"
  return text, None, None


class FusedExactLabels:
  """Exact search by the label-text fused score (score_fusion.py) over all L."""

  def __init__(
    self,
    fusion: score_fusion.LabelTextFusion,
    classifier: np.ndarray,
    label_text_embeddings: np.ndarray,
    label_block: int = 32768,
    vote: neighbour_vote.NeighbourVote | None = None,
  ):
    rows = fusion.label_rows(classifier, label_text_embeddings)
    self.inner = ExactLabels(rows, label_block, vote)
    self.fusion = fusion

  def search(
    self, emb: np.ndarray, k: int, votes: neighbour_vote.Votes | None = None
  ) -> tuple[np.ndarray, np.ndarray]:
    return self.inner.search(self.fusion.query_rows(emb), k, votes, score=self.fusion)


class Predictor:
  """Top-k labels for new texts from a trained model.

    p = Predictor.from_workdir("workdir/demo")            # ScaNN (index built once, cached)
    p = Predictor.from_workdir("workdir/demo", index="exact")
    out = p.predict(["some query", ...], k=10)            # out.ids, out.labels, out.scores

  Texts are tokenized exactly as training did (the exported tokenizer, truncation to the
  trained max_len, padding) and encoded without dropout, padding columns beyond a batch's
  longest row cut to a sequence bucket. `timings` holds the last call's seconds:
  tokenize, encode (to host embeddings), search.
  """

  def __init__(
    self,
    model: export.Model,
    index: str = "scann",
    scann_knobs: dict | None = None,
    rebuild_index: bool = False,
  ):
    """Opens (or builds) the index; nothing is compiled yet (`warmup` compiles every bucket).

    Args:
      model: a trained model (`export.load_model`).
      index: "scann" (ScaNN over W, built on first use and cached in the model's
        directory; exact below serve_index.MIN_ROWS labels) or "exact" (blocked top-k).
      scann_knobs: overrides of serve_index.serving_params (leaves, leaves searched, ...).
      rebuild_index: build the ScaNN index even when a cached one matches.
    Raises:
      InputError: an unknown `index`.
    """
    self.model = model
    self.tokenizer = tokenize.load_tokenizer(model.tokenizer_dir)
    graphdef = model.graphdef
    self._embed = jax.jit(lambda p, ids: nnx.merge(graphdef, p)(ids))
    # Cutting columns off is only padding removal when the tokenizer pads on the right.
    right = getattr(self.tokenizer, "padding_side", "right") == "right"
    self.seq_buckets = seq_buckets(model.max_len) if right else (model.max_len,)
    self.num_labels = len(model.classifier)
    if index == "scann" and not scann_available():
      warn_scann_missing()
      index = "exact"
    if index == "scann" and self.num_labels < serve_index.MIN_ROWS:
      logging.info(
        "%d labels: exact search (ScaNN needs at least %d rows, and exact costs nothing here)",
        self.num_labels,
        serve_index.MIN_ROWS,
      )
      index = "exact"
    scoring = model.meta.get("scoring") or {}
    self.fusion = None
    if scoring.get("label_text_weight") and model.label_texts is not None:
      # The model ranks by the fused score (score_fusion.py), which needs every E(z_l) and
      # an exact pass over all L: the ScaNN index holds W alone.
      self.fusion = score_fusion.LabelTextFusion(
        float(scoring["label_text_weight"]),
        float(scoring["label_text_scale"]),
        model.encoder_cfg.embed_dim,
        float(scoring.get("label_text_shift", 0.0)),
      )
      if index == "scann":
        logging.info(
          "the model mixes label-text similarity into its scores "
          "(scoring.label_text_weight=%s): exact search",
          scoring["label_text_weight"],
        )
        index = "exact"
    # The training rows vote (neighbour_vote.py) over all L: exact, like the fusion.
    self.vote = neighbour_vote.from_scoring(scoring) if model.memory is not None else None
    # A ScaNN index over the memory (ann/memory_search.py) is kept in the model directory.
    self.memory = None
    if self.vote is not None:
      store = serve_index.MemoryIndexStore(model.path, model.model_id)
      self.memory = model.memory.with_index_store(store)
    # The lexical terms (xc/lexical.py) enter as votes beside the memory's.
    self.lexical = lexical.from_scoring(scoring) if model.lexical is not None else None
    if self.lexical is not None and not self.lexical.total:
      self.lexical = None
    self.model_vote_weight = self.vote.weight if self.vote is not None else 0.0
    if self.lexical is not None:
      self.vote = lexical.fold(self.vote, self.lexical, neighbour_vote.search_settings(scoring))
    if self.vote is not None and index == "scann":
      logging.info(
        "the model mixes the neighbour vote into its scores "
        "(scoring.neighbour_weight=%s): exact search",
        scoring["neighbour_weight"],
      )
      index = "exact"
    if index == "exact" and self.fusion is not None:
      texts = self.encode(self.to_tokens(model.label_texts)[0])
      self.index = FusedExactLabels(self.fusion, model.classifier, texts, vote=self.vote)
    elif index == "exact":
      self.index = ExactLabels(model.classifier, vote=self.vote)
    elif index == "scann":
      params = serve_index.serving_params(self.num_labels, **(scann_knobs or {}))
      self.index = serve_index.open_scann(
        model.path, model.model_id, model.classifier, params, rebuild_index
      )
    else:
      raise InputError(f"index {index!r}: use scann or exact")
    self.index_kind = index
    self.timings: dict[str, float] = {}
    # A query's own item (the label with the query's text) is left out when the training
    # run filtered it (data.filter_self, data/self_filter.py).
    self.own_items: dict[str, list[int]] = {}
    # Retired labels (serving/grow.py) keep their ids and rows and are never returned.
    self.retired: set[int] = set(model.meta.get("retired", []))
    if model.meta.get("filter_self") and model.label_texts is not None:
      for label, text in enumerate(model.label_texts):
        self.own_items.setdefault(text.strip(), []).append(label)

  @classmethod
  def from_workdir(cls, workdir: str, index: str = "scann", **kwargs) -> Predictor:
    """A Predictor over the model a training run exported.

    Args:
      workdir: the training run's workdir (its `model/` directory is read).
      index: "scann" or "exact", as for the constructor.
      **kwargs: the constructor's `scann_knobs` and `rebuild_index`.
    Returns:
      The Predictor.
    Raises:
      export.ModelNotFoundError: no finished model in `workdir` (the message names the path).
    """
    return cls(export.load_model(workdir), index, **kwargs)

  def to_tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int | None]]:
    """Tokenizes as training did.

    Args:
      texts: the queries.
    Returns:
      (tokens (n, max_len) int32, padded with the model's pad id; for each text its token
      count before truncation where it was truncated, else None).
    """
    max_len, pad = self.model.max_len, self.model.pad_id
    tokens = tokenize.tokenize_texts(texts, self.tokenizer, max_len)
    lengths: list[int | None] = [None] * len(texts)
    full = np.flatnonzero(tokens[:, -1] != pad)  # only rows filling max_len can be cut
    if len(full):
      enc = self.tokenizer(
        [texts[i] for i in full],
        truncation=False,
        verbose=False,
        return_attention_mask=False,
        return_token_type_ids=False,
      )
      for i, ids in zip(full, enc["input_ids"]):
        if len(ids) > max_len:
          lengths[i] = len(ids)
    return tokens, lengths

  def encode(self, tokens: np.ndarray) -> np.ndarray:
    """Embeds token rows under jit, in bucket-sized padded batches (bounded compiles).

    Args:
      tokens: (n, max_len) int32 as `to_tokens` returns them.
    Returns:
      E(x), (n, d) float32 on the host.
    """
    out = np.empty((len(tokens), self.model.encoder_cfg.embed_dim), np.float32)
    for start, end in _chunks(len(tokens)):
      ids = np.asarray(tokens[start:end], np.int32)
      longest = int((ids != self.model.pad_id).sum(1).max())
      ids = ids[:, : next(t for t in self.seq_buckets if t >= longest)]
      ids = _pad_rows(ids, _bucket(end - start))
      out[start:end] = np.asarray(self._embed(self.model.encoder_params, ids))[: end - start]
    return out

  def warmup(self, k: int = 10) -> None:
    """Compiles every bucket's encoder (and exact search) shape, so that no later call
    waits for a compile.

    Args:
      k: the k later calls will ask for (the exact search compiles per k).
    """
    for b in _BUCKETS:
      for t in self.seq_buckets:
        tokens = np.full((b, self.model.max_len), self.model.pad_id, np.int32)
        tokens[:, :t] = self.model.pad_id + 1  # a batch whose longest row has t tokens
        self._search(self.encode(tokens), k, [""] * b)

  def predict(self, texts: Sequence[str | bytes], k: int = 10) -> Predictions:
    """Top-k labels for each text; bad inputs get an error in their row and never stop the
    others.

    Args:
      texts: the queries, as str or UTF-8 bytes (one str or bytes is one query).
      k: labels per query (at most the number of labels).
    Returns:
      Predictions with row i for texts[i]: ids and exact scores <w_l, E(x)>, best first,
      label texts when the model has them, an error (empty, not valid UTF-8: ids -1,
      scores nan) or a warning (truncated to the trained max_len).
    Raises:
      InputError: k < 1.
    """
    if isinstance(texts, (str, bytes)):
      texts = [texts]
    if k < 1:
      raise InputError(f"k must be >= 1, got {k}")
    k = min(k, self.num_labels)
    n = len(texts)
    t0 = time.perf_counter()
    checked = [check_text(t) for t in texts]
    errors = [e for _, e, _ in checked]
    warnings = [w for _, _, w in checked]
    ok = [i for i, (t, _, _) in enumerate(checked) if t is not None]
    tokens, lengths = self.to_tokens([checked[i][0] for i in ok])
    for i, length in zip(ok, lengths):
      if length is not None:
        cut = f"truncated to the trained max_len of {self.model.max_len} tokens (had {length})"
        warnings[i] = f"{warnings[i]}; {cut}" if warnings[i] else cut
    t1 = time.perf_counter()
    emb = self.encode(tokens)
    t2 = time.perf_counter()
    extra = max((len(v) for v in self.own_items.values()), default=0) + len(self.retired)
    s, i = self._search(emb, min(k + extra, self.num_labels), [checked[j][0] for j in ok])
    if extra:
      s, i = self._without_own_items([checked[j][0] for j in ok], s, i, k)
    t3 = time.perf_counter()
    scores, ids = np.full((n, k), np.nan, np.float32), np.full((n, k), -1, np.int32)
    scores[ok], ids[ok] = s[:, :k], i[:, :k]
    labels = None
    if self.model.label_texts is not None:
      names = self.model.label_texts
      labels = [[names[j] for j in row if j >= 0] for row in ids.tolist()]
    self.timings = {"tokenize_s": t1 - t0, "encode_s": t2 - t1, "search_s": t3 - t2}
    return Predictions(ids, scores, labels, errors, warnings)

  def _search(self, emb: np.ndarray, k: int, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The index's top k of the embedded queries (`texts`), with their votes when the score
    votes."""
    if self.vote is None:
      return self.index.search(emb, k)
    own = None
    if self.memory is not None:
      own = self.memory.votes(emb, self.vote)  # the votes; their weight is the fold's
    if self.lexical is None:
      return self.index.search(emb, k, own)
    w = self.lexical
    terms = self.model.lexical.votes(texts, w.k, w.temperature)
    return self.index.search(emb, k, lexical.fold_votes(own, self.model_vote_weight, terms, w))

  def _without_own_items(
    self, texts: list[str], scores: np.ndarray, ids: np.ndarray, k: int
  ) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ranking without the labels whose text is the row's and the retired
    labels, cut to k."""
    out_s, out_i = np.full((len(ids), k), np.nan, np.float32), np.full((len(ids), k), -1, np.int32)
    for r, text in enumerate(texts):
      own = self.retired | set(self.own_items.get(text.strip(), ()))
      keep = [j for j, label in enumerate(ids[r]) if label not in own][:k]
      out_s[r, : len(keep)], out_i[r, : len(keep)] = scores[r, keep], ids[r, keep]
    return out_s, out_i
