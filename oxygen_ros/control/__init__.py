"""Robot-side control of action chunks: semantics, limits, smoothing (numpy only, no ROS)."""
