"""Serve MathJax 3 from the site itself instead of a CDN, so pages typeset offline.

The MathJax files come from the PyPI package ``django-static-mathjax`` (MathJax 3.2.2,
no dependencies; installed by the ``book`` extra), whose ``mathjax/static`` folder is added
to the site's static files. Without the package the default CDN is kept.
"""

from pathlib import Path


def _use_local_mathjax(app, config):
    try:
        import mathjax  # the django-static-mathjax package
    except ImportError:
        return
    static = Path(mathjax.__file__).parent / "static"
    if (static / "mathjax" / "es5" / "tex-mml-chtml.js").exists():
        config.html_static_path.append(str(static))
        config.mathjax_path = "mathjax/es5/tex-mml-chtml.js"


def setup(app):
    app.connect("config-inited", _use_local_mathjax)
    return {"parallel_read_safe": True}
