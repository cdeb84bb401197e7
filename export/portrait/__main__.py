"""`python -m export.portrait`: the command of recipe.py (`--help` lists its options)."""

from export.portrait.recipe import main

if __name__ == "__main__":
    main()
