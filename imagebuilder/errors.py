"""Errors imagebuilder reports to its users.

One pattern for all of them: a subclass names its message `template`; the constructor
takes the template's fields as keywords, stores each as an attribute and formats the
message. cli.py turns any ImageBuilderError into a one-line message and exit code 1
(2 for BadRequest).

    class UnknownImage(ImageBuilderError):
        template = "image {ref} does not exist; build it first"

    UnknownImage(ref="pytorch:2.6")  # .ref == "pytorch:2.6"
"""

from __future__ import annotations

from typing import Any, ClassVar


class ImageBuilderError(Exception):
    """Base class: a failure the user can act on (exit 1)."""

    exit_code: ClassVar[int] = 1
    template: ClassVar[str] = "{message}"

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        if message is not None:
            fields.setdefault("message", message)
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)
        super().__init__(self.describe())

    def describe(self) -> str:
        """The one-line message; a subclass whose wording depends on its data overrides it."""
        return self.template.format(**self.fields)

    @property
    def exit_status(self) -> int:
        """The exit status cli.py exits with: the class's, unless the error's data decides
        (a build step that stopped because the request cannot be built)."""
        return self.exit_code

    def details(self) -> list[str]:
        """Lines shown under the one-line message (a failing step's last output, say)."""
        return []


class BadRequest(ImageBuilderError):
    """The request names something that does not exist or cannot be combined (exit 2)."""

    exit_code: ClassVar[int] = 2
