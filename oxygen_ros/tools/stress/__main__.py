"""``python -m oxygen_ros.tools.stress`` is ``oxygen_stress`` (no install needed)."""

import sys

from oxygen_ros.tools.stress import main

sys.exit(main())
