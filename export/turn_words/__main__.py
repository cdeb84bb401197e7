"""`python -m export.turn_words`: the command of recipe.py (`--help` lists its options)."""

from export.turn_words.recipe import main

if __name__ == "__main__":
    main()
