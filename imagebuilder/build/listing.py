"""`imagebuilder matrix`: one row per selected image, as a table, JSON or a GitHub Actions matrix."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..matrix.model import Matrix
from ..matrix.selection import Selection, select_specs
from .table import format_table
from .tags import primary_tag


def matrix_rows(matrix: Matrix, selection: Selection) -> list[dict[str, Any]]:
    """`imagebuilder matrix`: one row per selected image."""

    return [{
        "torch": str(spec.torch.version),
        "cuda": str(spec.cuda.key),
        "wheel": spec.wheel.name,
        "cudnn": str(spec.wheel.cudnn),
        "nccl": str(spec.wheel.nccl),
        "python": str(spec.python),
        "os": spec.os.name,
        "variant": spec.variant,
        "min_driver": str(spec.min_driver),
        "tag": primary_tag(spec, matrix),
        "platforms": list(spec.torch.platforms),
    } for spec in select_specs(matrix, selection)]


def format_listing(rows: Sequence[dict[str, Any]], fmt: str) -> str:
    """`imagebuilder matrix --format table|json|github` of `matrix_rows`."""

    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "github":
        include = [{k: r[k] for k in ("torch", "cuda", "python", "os", "variant", "tag")} for r in rows]
        return json.dumps({"include": include}, separators=(",", ":"))
    if not rows:
        return "(no images match)"
    return format_table([h.upper() for h in rows[0]],
                        [[",".join(v) if isinstance(v, list) else v for v in r.values()] for r in rows])
