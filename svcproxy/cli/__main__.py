"""``python -m svcproxy.cli``: the ``svcproxy`` command."""

import sys

from svcproxy.cli import main

sys.exit(main())
