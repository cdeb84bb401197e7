"""`python -m export.turn_detector`: the command of recipe.py (`--help` lists its options)."""

from export.turn_detector.recipe import main

if __name__ == "__main__":
    main()
