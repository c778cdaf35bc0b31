"""``python -m ocrserve`` runs the command-line interface."""

from ocrserve.cli import main

main()
