"""π0.5 with OxyGen unified KV cache management, as a ROS 2 package."""
