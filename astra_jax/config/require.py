"""The one-line error a bad config field raises."""

from __future__ import annotations

from astra_jax.runtime.errors import InputError


def require(condition: object, field: str, message: str) -> None:
  """Raises InputError("config.<field>: <message>") unless `condition` holds."""
  if not condition:
    raise InputError(f"config.{field}: {message}")
