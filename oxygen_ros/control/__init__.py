"""Robot-side control of action chunks: semantics, limits, smoothing, RTC (numpy only, no ROS)."""
