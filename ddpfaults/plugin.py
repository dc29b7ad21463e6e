"""pytest plugin entry point (``pytest -p ddpfaults``). Thin glue over the library core."""
