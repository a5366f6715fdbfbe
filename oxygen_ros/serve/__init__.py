"""
``oxygen_serve``: the engine behind openpi's websocket policy protocol (docs/serving.md).

A runtime entry point beside the ROS node, for openpi harnesses and robots not on ROS 2:
``wire`` (openpi's msgpack-numpy, bounded, no pickle), ``layouts`` (the LIBERO, DROID and ALOHA
observation keys, checked against the preset), ``language`` (OxyGen's text requests and
``language_updates`` per connection), ``driver`` (one engine, one frame at a time),
``auth`` (bind policy, API keys, TLS), ``server`` (websockets) and ``app`` (the command line).
Nothing here imports rclpy, and nothing heavy happens at import.
"""
