"""``torchrun ... -m ddpfaults.launch FILE.py::name[variant]``: the torchrun worker's entry point (see
:mod:`ddpfaults.torchrun.worker`)."""

import sys

from ddpfaults.torchrun.worker import main

if __name__ == "__main__":
    sys.exit(main())
