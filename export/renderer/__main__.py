"""`python -m export.renderer`: the command of recipe.py (`--help` lists its options)."""

from export.renderer.recipe import main

if __name__ == "__main__":
    main()
