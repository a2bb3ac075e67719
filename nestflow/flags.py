"""Process-wide switches (Fluid's `fluid.set_flags` / `FLAGS_...`): `nf.set_flags` and
`nf.get_flags`.

>>> import nestflow as nf
>>> nf.set_flags({"check_nan_inf": True})
>>> nf.get_flags("check_nan_inf")
{'check_nan_inf': True}
>>> nf.set_flags({"FLAGS_check_nan_inf": False})  # Fluid's spelling works too
>>> nf.get_flags(["FLAGS_check_nan_inf"])
{'FLAGS_check_nan_inf': False}

Flags:
- `check_nan_inf` (default False): every Executor run checks each fed float array and each
  float output of every op, sub-blocks included, and raises NanInfError naming the first op
  that produced NaN or Inf and the user's line that built it (as
  `Executor(check_nan_inf=True)`; an Executor or run given check_nan_inf=False explicitly
  stays unchecked). It costs time: each op runs on its own instead of in the block's
  compiled function, and every output is scanned (W1's training step: 3.74 ms -> 4.05 ms,
  one BLAS thread; the more and smaller the ops, the more it costs), so turn it on to find
  where a NaN comes from rather than for every training run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nestflow.errors import AttrError, suggest_names

__all__ = ["get_flags", "set_flags"]

# The current value of each flag; read directly where speed matters (Executor.run).
FLAGS: dict[str, bool] = {"check_nan_inf": False}

_FLUID_PREFIX = "FLAGS_"


def _known(name: Any) -> str:
    """`name` without Fluid's FLAGS_ prefix; AttrError if it is no flag."""
    if not isinstance(name, str):
        raise AttrError(f"a flag name must be a str, got {type(name).__name__} ({name!r})")
    bare = name[len(_FLUID_PREFIX) :] if name.startswith(_FLUID_PREFIX) else name
    if bare not in FLAGS:
        raise AttrError(
            f"unknown flag {name!r}{suggest_names(bare, FLAGS)}; the flags: {sorted(FLAGS)}"
        )
    return bare


def set_flags(flags: Mapping[str, bool]) -> None:
    """Set each flag of `flags` (name -> value; a name may carry Fluid's `FLAGS_` prefix) for
    the rest of the process, in every thread. An unknown name or a value that is not a bool
    -> AttrError, and then no flag changes.

    >>> nf.set_flags({"check_nan_inf": False})
    """
    if not isinstance(flags, Mapping):
        raise AttrError(f"set_flags takes a dict of flag name -> value, got {type(flags).__name__}")
    checked = {}
    for name, value in flags.items():
        bare = _known(name)
        if not isinstance(value, bool):
            raise AttrError(f"flag {name!r} must be True or False, got {value!r}")
        checked[bare] = value
    FLAGS.update(checked)


def get_flags(names: str | Iterable[str]) -> dict[str, bool]:
    """{name: current value} for a flag name or a list of them, keyed as asked (with or
    without Fluid's `FLAGS_` prefix). An unknown name -> AttrError.

    >>> nf.get_flags(["check_nan_inf", "FLAGS_check_nan_inf"])
    {'check_nan_inf': False, 'FLAGS_check_nan_inf': False}
    """
    if isinstance(names, str):
        names = [names]
    elif not isinstance(names, Iterable):
        raise AttrError(f"get_flags takes a flag name or a list of them, got {names!r}")
    return {name: FLAGS[_known(name)] for name in names}
