import sys

from nodes.server import main

sys.exit(main())
