"""Errors caused by the user's input (data files, config, model files). `main` prints them
as one line; anything else is a bug and keeps its traceback."""


class InputError(ValueError):
  """Bad input; the message names the file and line, or the config field."""
