"""`python -m nestflow.distributed script.py [args]` (or `-m module [args]`): run a training
script as one rank of an MPI job so that its failure ends the whole job.

The script runs as `__main__` with sys.argv = [script, *args] (as `python script.py args`
would). An exception that escapes it, or sys.exit with a non-zero status, prints this rank's
traceback and aborts every rank (MPI_Abort) with a non-zero exit status, also when it happens
before the script called nf.distributed.init(). A script that ends normally without having
joined MPI leaves a note for `nestflow launch`, which ends the job when another rank waits for
it in nf.distributed.init() (it would wait for ever). `nestflow launch` runs every rank this
way.
"""

from __future__ import annotations

import runpy
import sys
import traceback

from nestflow.distributed.runtime import abort, joined_mpi, leave_launch_note

USAGE = "usage: python -m nestflow.distributed (script.py | -m module) [args ...]"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr if argv[:1] != ["-h"] else sys.stdout)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    module = argv[0] == "-m"
    target = argv[1] if module else argv[0]
    sys.argv = argv[1:] if module else list(argv)
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, _directory_of(target))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None or code == 0:
            return _left(0)
        status = code if isinstance(code, int) else 1
        if not isinstance(code, int):
            print(code, file=sys.stderr)
        abort(f"exited with status {status}; aborting every rank of the job", status)
    except BaseException as exc:  # noqa: BLE001  (every failure must end the whole job)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        abort(f"failed; aborting every rank of the job:\n{text.rstrip()}", 1)
    return _left(0)


def _left(status: int) -> int:
    """`status`, after telling `nestflow launch` when this rank ends without having joined
    MPI: a rank waiting for it in nf.distributed.init() would wait for ever, so the launcher
    ends the job."""
    if not joined_mpi():
        leave_launch_note(
            "left", f"exited with status {status} without calling nf.distributed.init()"
        )
    return status


def _directory_of(path: str) -> str:
    import os

    return os.path.dirname(os.path.abspath(path))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
