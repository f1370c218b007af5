from bench._cli import run
from bench.throughput import main

if __name__ == "__main__":
    run(main)
