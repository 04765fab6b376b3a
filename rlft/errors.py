"""Errors that end a run on purpose, with a message for the person running it (importable without torch)."""

from __future__ import annotations


class TrainingHalted(RuntimeError):
    """The run stopped itself (non-finite values in a row, a stop signal); the message says why and where to resume
    from. ``exit_code`` is what ``rlft`` exits with: 3, or 128 + the signal's number for a signal."""

    def __init__(self, message: str, exit_code: int = 3):
        super().__init__(message)
        self.exit_code = exit_code
