"""``python -m oxygen_ros.tools.bag`` is ``oxygen_bag`` (no install needed)."""

import sys

from oxygen_ros.tools.bag import main

sys.exit(main())
