"""torchrun"""
