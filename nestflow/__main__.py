"""`python -m nestflow ...` is the `nestflow` command."""

import sys

from nestflow.cli.main import main

sys.exit(main())
