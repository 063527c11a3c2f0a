from sim.cli import app

app()
