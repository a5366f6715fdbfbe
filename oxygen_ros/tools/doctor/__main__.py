"""``python -m oxygen_ros.tools.doctor``: the same as ``oxygen_doctor``."""

import sys

from oxygen_ros.tools.doctor import main

sys.exit(main())
