"""Sphinx extension: every script tag at most once per page.

sphinx-thebe 0.3.1, which Jupyter Book 1 always loads, registers its inline
configuration script (``const THEBE_JS_URL = ...``) twice in this book's build,
so every page threw "SyntaxError: Identifier 'THEBE_JS_URL' has already been
declared" in the reader's browser (found by ``make check-book``). Dropping exact
duplicates, after every other extension has added its scripts, removes the error
and changes nothing else.
"""

from __future__ import annotations


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        # what the page gets: the same file (or inline body) with the same attributes.
        # An inline script's filename is None or "" depending on how it was added,
        # which is why Sphinx's own check lets the second copy through.
        attributes = getattr(script, "attributes", {})
        key = (str(getattr(script, "filename", script) or ""), tuple(sorted(attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
