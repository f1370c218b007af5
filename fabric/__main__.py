import sys

from fabric.cli import main

sys.exit(main())
