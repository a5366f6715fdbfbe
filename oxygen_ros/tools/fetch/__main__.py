"""``python -m oxygen_ros.tools.fetch`` is ``oxygen_fetch`` (no install needed)."""

import sys

from oxygen_ros.tools.fetch import main

sys.exit(main())
