"""``python -m gnnaas.cli``: the ``gnnaas`` command."""

import sys

from gnnaas.cli import main

sys.exit(main())
