"""`python -m streamrl.cli`: how `streamrl run` starts its processes."""

from streamrl.cli import app

app()
