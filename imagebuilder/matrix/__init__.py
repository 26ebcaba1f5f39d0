"""The matrix: matrix.yaml as a frozen model (load, its YAML with a line per key path), requests resolved
into BuildSpecs, the selection, the variants. (`matrix add`, which reads the package index, is lock/matrix_add.py.)

The face: what the commands (cli, options, pipeline) use; the rest of imagebuilder imports
from the module that defines a name."""

from .load import load_matrix, matrix_file
from .model import VARIANTS, Matrix
from .resolve import check_not_empty, enumerate_matrix
from .selection import ALL, Note, NothingSelected, ReadOsRelease, Selection, select_specs, settle_os

__all__ = ["ALL", "Matrix", "Note", "NothingSelected", "ReadOsRelease", "Selection", "VARIANTS",
           "check_not_empty", "enumerate_matrix", "load_matrix", "matrix_file", "select_specs", "settle_os"]
