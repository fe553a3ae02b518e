"""Errors that carry an MPI error class, as mpi4py's ``MPI.Exception`` does.

A program written for mpi4py catches ``MPI.Exception`` and reads ``Get_error_class()``; course_lib
raises these where MPI returns an error code (a root outside the communicator, say). They are also
``ValueError``s, which is what the same mistake raises elsewhere in course_lib. The numbers are
MPICH's (mpi4py exposes the MPI library's own); a portable program compares with the names.
"""
from __future__ import annotations

SUCCESS = 0
ERR_RANK = 6
ERR_ROOT = 7
ERR_OP = 9

_NAMES = {SUCCESS: "MPI_SUCCESS", ERR_RANK: "MPI_ERR_RANK", ERR_ROOT: "MPI_ERR_ROOT", ERR_OP: "MPI_ERR_OP"}


class MPIError(ValueError):
    """``MPI.Exception``: ``Get_error_class()`` is the MPI error class (``MPI.ERR_ROOT``, ...)."""

    def __init__(self, error_class: int, message: str):
        super().__init__(message)
        self.error_class = error_class

    def Get_error_class(self) -> int:
        return self.error_class

    def Get_error_code(self) -> int:
        return self.error_class

    def Get_error_string(self) -> str:
        return f"{_NAMES.get(self.error_class, 'MPI_ERR_OTHER')}: {self}"
