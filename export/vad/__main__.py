"""`python -m export.vad`: the command of recipe.py (`--help` lists its options)."""

from export.vad.recipe import main

if __name__ == "__main__":
    main()
