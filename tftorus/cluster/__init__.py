"""A rank's side of the job's start: find the cluster (TF_CONFIG, srun, mpirun's rendezvous,
horovodrun) and start TensorFlow's collective runtime over it, before anything else touches
TensorFlow. Imports launch (the variables a launcher gives a rank)."""
