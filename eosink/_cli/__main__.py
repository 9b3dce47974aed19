"""``python -m eosink._cli``: the ``eosink`` command."""

import sys

from . import main

sys.exit(main())
