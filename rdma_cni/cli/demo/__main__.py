"""``python -m rdma_cni.cli.demo`` (what ``scripts/demo`` runs): :mod:`.command`."""

import sys

from rdma_cni.cli.demo.command import main

if __name__ == "__main__":
    sys.exit(main())
