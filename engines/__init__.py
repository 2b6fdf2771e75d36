"""Engine adapters and their lifecycle; nothing here knows HTTP (see engines/base.py)."""
