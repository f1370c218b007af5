import sys

from sequencer.service import main

sys.exit(main())
