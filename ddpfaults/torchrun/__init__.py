"""Worlds that torchrun starts (``python -m ddpfaults.launch``): each rank reports through the store."""
