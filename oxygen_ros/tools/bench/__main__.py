"""``python -m oxygen_ros.tools.bench`` is ``oxygen_bench`` (no install needed)."""

import sys

from oxygen_ros.tools.bench import main

sys.exit(main())
