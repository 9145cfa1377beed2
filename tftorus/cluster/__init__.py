"""A rank's side of the start: where the ranks are (discovery, mpirun's rendezvous) and TF's
collective runtime started over them (tf_runtime). Imports launch."""
