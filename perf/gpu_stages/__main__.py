"""`python -m perf.gpu_stages`: the same command as `python -m perf gpu-stages`."""

import sys

from perf.gpu_stages.cli import main

sys.exit(main())
