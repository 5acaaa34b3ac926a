"""Small fixes to the generated pages, found by the browser test (tests/test_site.py).

- Jupyter Book 1 registers sphinx-thebe's inline configuration script twice, so every page
  logs "Identifier 'THEBE_JS_URL' has already been declared": keep one copy of each script.
"""


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    seen, kept = set(), []
    for js in context.get("script_files", []):
        attrs = getattr(js, "attributes", None) or {}
        key = (str(getattr(js, "filename", js) or ""), attrs.get("body"))  # None and "" both mean inline
        if key not in seen:
            seen.add(key)
            kept.append(js)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True}
