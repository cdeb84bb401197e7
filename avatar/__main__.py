import sys

from avatar.cli import main

sys.exit(main())
