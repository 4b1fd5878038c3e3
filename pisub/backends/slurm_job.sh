#!/bin/sh
# pisub's Slurm batch script: the job's main process becomes the argv sbatch passed after this
# script's name (python -m pisub.runner RUN --foreground). No shell string is ever built.
exec "$@"
