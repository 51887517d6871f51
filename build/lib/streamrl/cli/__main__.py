"""`python -m streamrl.cli`: how `streamrl run` starts its processes."""

from streamrl.cli import app

if __name__ == "__main__":  # not in a child process that multiprocessing spawns
    app()
