"""Camera images: raw ``sensor_msgs/Image``, image_transport's compressed ones, the choice."""
