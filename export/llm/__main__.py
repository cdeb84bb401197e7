"""`python -m export.llm`: the command of recipe.py (`--help` lists its options)."""

from export.llm.recipe import main

if __name__ == "__main__":
    main()
