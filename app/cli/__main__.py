"""`python -m app.cli`: the `memchat` command."""

import sys

from app.cli.main import main

sys.exit(main())
