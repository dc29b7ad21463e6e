"""Code that runs inside a rank process; imports nothing of the launchers or the pytest plugin."""
