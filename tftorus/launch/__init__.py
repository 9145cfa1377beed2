"""The launcher's side, standard library only: `python -m tftorus.run` (local) and the HOROVOD_*
variables a launcher gives each rank (rank_layout). Imports nothing, so launching starts no TF."""
