import sys

from bench.throughput import main

if __name__ == "__main__":
    sys.exit(main())
