"""The local engine: start a world's rank processes on this machine, watch them, pool healthy ones, reap all."""
