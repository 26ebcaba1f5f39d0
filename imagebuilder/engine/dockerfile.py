"""The one parser of a Dockerfile's FROM line, for both builders' progress and errors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class From:
    image: str
    """As written: `${BASE_IMAGE}` stays unexpanded (the classic builder's stream shows it so)."""
    stage: str | None = None
    """The `AS name` of the stage; None for an unnamed one."""
    platform: str | None = None
    """`--platform=...` as written."""


def parse_from(instruction: str) -> From | None:
    """`FROM [--platform=P] IMAGE [AS NAME]` -> its parts; None for any other instruction."""
    words = instruction.split()
    if not words or words[0].upper() != "FROM":
        return None
    flags = [w for w in words[1:] if w.startswith("--")]
    args = [w for w in words[1:] if not w.startswith("--")]
    platform = next((f.partition("=")[2] for f in flags if f.startswith("--platform=")), None)
    stage = args[2] if len(args) >= 3 and args[1].upper() == "AS" else None
    return From(args[0] if args else "", stage, platform)


def is_from(instruction: str) -> bool:
    return parse_from(instruction) is not None
