"""``python -m clusterddp`` is the same as the ``clusterddp`` command."""

import sys

from clusterddp.entry import main

sys.exit(main())
