from sim.entrypoints.cli import main

main()
