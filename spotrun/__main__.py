"""`python -m spotrun` runs the CLI (used to start agents without relying on PATH)."""

from spotrun.cli import main

if __name__ == "__main__":
    main()
