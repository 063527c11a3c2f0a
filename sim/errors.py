"""The one family of bad-input errors.

Anything raised as an ``InputError`` is the user's input being wrong (a YAML typo, a
negative size, a broken trace line, an output path that may not be used): the CLI
prints its message as one line, ``error: <message>``, and exits 2, having written
nothing.  Every other exception is a bug and keeps its traceback.

The message names the file and the field path (or trace file and line) and what is
wrong; subclasses exist only so callers can tell the sources apart.
"""
from __future__ import annotations


#: the longest message an input error prints: values in it are shown by a short prefix
#: (``sim.config.fields.show``); this bounds whatever else a message may have quoted
MAX_MESSAGE = 1000
#: the longest field path a message shows (a path holds the user's keys)
MAX_FIELD = 120


class InputError(ValueError):
    """Bad input: one line naming file, field (or line) and the problem."""

    def __init__(self, message: str = ""):
        # one line, whatever the parts that built it held, and never a screenful
        text = " ".join(str(message).split())
        if len(text) > MAX_MESSAGE:
            text = text[:MAX_MESSAGE - 3] + "..."
        super().__init__(text)


class CapacityError(InputError):
    """The deployment cannot serve the workload: a pool too small for
    ``max_model_len`` or for a waiting request (the engine's progress guard), or
    too large for this machine's memory.  Reported like any bad input."""


class ConfigError(InputError):
    """Invalid configuration; ``str()`` names the field and the problem."""

    def __init__(self, field_name: str, message: str):
        shown = " ".join(str(field_name).split())
        if len(shown) > MAX_FIELD:       # (a key is the user's text too: a prefix of it)
            shown = shown[:MAX_FIELD - 3] + "..."
        super().__init__(f"{shown}: {message}")
        self.field_name = field_name
        self.reason = message            # (as data: a caller renaming the field reuses it)
