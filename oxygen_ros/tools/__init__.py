"""Console scripts, one per thing a user does (setup.py; docs/tools.md), helpers in ``common``."""
