"""The program description: framework.proto and its Python wrappers (Program, Block, ...)."""

from nestflow.framework import unique_name
from nestflow.framework.program import (
    GRAD_SUFFIX,
    Block,
    OpDesc,
    Program,
    VarDesc,
    default_main_program,
    default_startup_program,
    grad_var_name,
    install_op_validator,
    program_guard,
    switch_main_program,
    switch_startup_program,
    user_source_line,
)

__all__ = [
    "GRAD_SUFFIX",
    "Block",
    "OpDesc",
    "Program",
    "VarDesc",
    "default_main_program",
    "default_startup_program",
    "grad_var_name",
    "install_op_validator",
    "program_guard",
    "switch_main_program",
    "switch_startup_program",
    "unique_name",
    "user_source_line",
]
