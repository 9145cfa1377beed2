"""A rank's side of the job's start: where the ranks are (discovery: TF_CONFIG, srun, mpirun with
its rendezvous, horovodrun) and TensorFlow's collective runtime started over them (tf_runtime),
before anything else touches TensorFlow. Imports launch (the variables a launcher gives a
rank)."""
