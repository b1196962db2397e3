"""`python -m conduit.daemon` is the `conduit` command."""

import sys

from conduit.daemon.cli import main

sys.exit(main())
