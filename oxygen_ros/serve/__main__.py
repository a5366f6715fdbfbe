"""``python -m oxygen_ros.serve``: ``oxygen_serve``."""

import sys

from oxygen_ros.serve.app import main

sys.exit(main())
