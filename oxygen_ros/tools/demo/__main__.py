"""``python -m oxygen_ros.tools.demo`` is ``oxygen_demo`` (no install needed)."""

import sys

from oxygen_ros.tools.demo import main

sys.exit(main())
