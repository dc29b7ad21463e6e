"""Tiny seeded models and data for the built-in scenarios, and the demo."""
