"""What every command of the CLI shares: the matrix it reads (Context, loaded when a command
first asks), the stderr lines (note, progress) and the one place that maps errors to exit codes
(Group: an ImageBuilderError -> one `error:` line and its exit code, Ctrl-C -> 130)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click

from ..errors import ImageBuilderError
from ..matrix import Matrix, load_matrix


class Context:
    def __init__(self, matrix_path: Path) -> None:
        self.matrix_path = matrix_path

    @functools.cached_property
    def matrix(self) -> Matrix:
        return load_matrix(self.matrix_path)


pass_context = click.make_pass_decorator(Context)


def note(message: str) -> None:
    click.echo(f"note: {message}", err=True)


def progress(message: str) -> None:
    click.echo(message, err=True)


class UserError(click.ClickException):
    """An ImageBuilderError shown as one `error:` line with its own exit code."""

    def __init__(self, error: ImageBuilderError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_status  # type: ignore[misc]  # click's is a ClassVar; ours vary per error
        self.details = error.details()

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)
        for line in self.details:
            click.echo(line, err=True)


class Group(click.Group):
    """The one place that maps errors to exit codes, for every (sub)command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ImageBuilderError as e:
            raise UserError(e) from e
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            raise click.exceptions.Exit(130) from None
