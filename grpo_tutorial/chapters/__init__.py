"""Tools that belong to one chapter of the book (the package core does not import them)."""
