"""`python -m app.cli`: the `memchat` command."""

import sys

from app.cli import main

sys.exit(main())
