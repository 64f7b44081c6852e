"""`python -m mxattention ...` runs the command-line interface."""

import sys

from mxattention.cli.main import main

sys.exit(main())
