"""Errors that end a run on purpose, with a message for the person running it (importable without torch)."""

from __future__ import annotations


class TrainingHalted(RuntimeError):
    """The run stopped itself (e.g. non-finite values in a row); the message says why and where to resume from."""
