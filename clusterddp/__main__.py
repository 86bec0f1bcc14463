"""``python -m clusterddp`` is the same as the ``clusterddp`` command."""

import sys

from clusterddp.cli import main

sys.exit(main())
