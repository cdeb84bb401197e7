"""`python -m export.asr`: the command of recipe.py (`--help` lists its options)."""

from export.asr.recipe import main

if __name__ == "__main__":
    main()
