"""``python -m oxygen_ros.tools.keystore`` is ``oxygen_keystore`` (no install needed)."""

import sys

from oxygen_ros.tools.keystore import main

sys.exit(main())
