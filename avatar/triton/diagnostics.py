"""Native crash evidence from the python-backend stubs.

A stub that dies in native code (a fatal signal, or glibc aborting on heap corruption)
otherwise leaves one line in the server log, if any. `enable_crash_reports` makes it
write every thread's Python stack to stderr (the server log) first, so the log says
which Python code each thread was running when the process died.
"""

from __future__ import annotations

import faulthandler
import sys

import triton_python_backend_utils as pb_utils


def enable_crash_reports(model: str) -> None:
    """Call first in every model's `initialize`: SIGSEGV, SIGFPE, SIGABRT, SIGBUS and
    SIGILL print all threads' Python stacks before the stub dies."""
    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)
    pb_utils.Logger.log_verbose(f"{model}: fatal signals print all Python stacks to stderr")
