"""``python -m memfree.cli``: the ``memfree`` command without its installed script."""

import sys

from memfree.cli import main

sys.exit(main())
