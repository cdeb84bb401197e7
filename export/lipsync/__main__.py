"""`python -m export.lipsync`: the command of recipe.py (`--help` lists its options)."""

from export.lipsync.recipe import main

if __name__ == "__main__":
    main()
