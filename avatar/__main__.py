import sys

from avatar.serving.cli import main

sys.exit(main())
