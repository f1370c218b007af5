import sys

from nodes.launch import main

sys.exit(main())
