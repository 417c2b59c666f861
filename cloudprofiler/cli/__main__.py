"""``python -m cloudprofiler.cli``: the console script without the script on PATH."""

import sys

from cloudprofiler.cli import main

sys.exit(main())
