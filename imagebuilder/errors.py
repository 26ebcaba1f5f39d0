"""Errors imagebuilder reports to its users.

Every error carries the data it reports and says what to do; cli.py turns any
ImageBuilderError into a one-line message and exit code 1 (2 for BadRequest).
"""

from __future__ import annotations


class ImageBuilderError(Exception):
    """Base class: a failure the user can act on (exit 1)."""

    exit_code = 1

    def details(self) -> list[str]:
        """Lines shown under the one-line message (a failing step's last output, say)."""
        return []


class BadRequest(ImageBuilderError):
    """The request names something that does not exist or cannot be combined (exit 2)."""

    exit_code = 2
