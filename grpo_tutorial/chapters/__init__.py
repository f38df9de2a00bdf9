"""Tools that belong to one chapter of the book (diagrams, bandits, pitfalls, ...)."""
